#pragma once

// Private to the ucx backend (backends/bootstrap/ucx): what its files share. The backend class
// and module entry point are in ucx_bootstrap.cpp, the rendezvous in ucx_rendezvous.cpp, the
// strata handshake carried over UCX in ucx_handshake.cpp and the tag-matched data path
// (send/recv, progress, collectives, abort) in ucx_data.cpp.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <ucp/api/ucp.h>

#include <strata/bootstrap.hpp>
#include <strata/config.hpp>

#include "base/deadline.hpp"
#include "launch/contract.hpp"
#include "mesh/p2p_collectives.hpp"
#include "mesh/peer_mesh.hpp"
#include "net/handshake_codec.hpp"
#include "net/socket.hpp"

namespace strata::ucx {

inline constexpr const char* kSub = "ucx";

// Rendezvous records (docs/wire-format.md). Kinds differ from the tcp backend's 10/11 so
// that a rank started with another backend is recognised instead of misread.
inline constexpr uint16_t kHello = 30;
inline constexpr uint16_t kReply = 31;
inline constexpr uint16_t kTable = 32;
inline constexpr uint16_t kAbortRecord = 33;
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kMaxWorkerAddress = 16384;
inline constexpr size_t kMaxRecord = kMaxWorkerAddress + 1024;
inline constexpr size_t kMaxAbortReason = 1024;

// Tag layout: kind (8 bits) | sender rank (24 bits) | user tag or collective tag (32 bits).
enum class Kind : uint64_t { User = 0, Collective = 1, Abort = 2, Setup = 3, Handshake = 4 };
inline constexpr uint64_t kFullMask = ~uint64_t{0};
inline constexpr uint64_t kKindMask = uint64_t{0xFF} << 56;

inline uint64_t makeTag(Kind kind, int rank, uint32_t low) {
  return (static_cast<uint64_t>(kind) << 56) |
         ((static_cast<uint64_t>(static_cast<uint32_t>(rank)) & 0xFFFFFF) << 32) | low;
}
inline int tagRank(uint64_t tag) {
  return static_cast<int>((tag >> 32) & 0xFFFFFF);
}

// The rendezvous handshake over UCX (docs/wire-format.md, "Handshake"): the records of
// net/handshake_codec.hpp, each sent with tag {Handshake, connection id, step}, then the
// check-in (hello) and its reply.
enum Step : uint32_t {
  kStepChallenge = 1,
  kStepAuth = 2,
  kStepResult = 3,
  kStepHello = 4,
  kStepReply = 5
};
inline constexpr uint64_t kStepMask = kKindMask | 0xFFFFFFFFull;  // any connection id

inline std::string statusText(ucs_status_t status) {
  return ucs_status_string(status);
}

// Per-operation completion state, filled by UCX callbacks from inside ucp_worker_progress.
struct OpState {
  bool done = false;
  ucs_status_t status = UCS_OK;
  size_t length = 0;
  uint64_t senderTag = 0;
};

// UCX completion callbacks for OpState (ucx_data.cpp).
void sendDone(void* request, ucs_status_t status, void* user);
void recvDone(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user);
void closeDone(void* request, ucs_status_t status, void* user);

class UcxBootstrap;

struct Peer {
  UcxBootstrap* owner = nullptr;
  int rank = -1;
  ucp_ep_h ep = nullptr;
  // Set from UCX's error callback.
  std::atomic<bool> lost{false};
  std::chrono::steady_clock::time_point lostAt;
  std::string lostWhy;
};

// One rendezvous connection (a sockaddr endpoint), on rank 0 or on a client. It lives until
// the worker is destroyed, because UCX may call onRvError until then.
struct RvConn {
  ucp_ep_h ep = nullptr;
  uint32_t id = 0;  // rank 0's connection id, in the tag's rank field
  std::atomic<bool> failed{false};
  std::string why;
  std::string remote = "(unknown address)";
  enum class State { WaitAuth, WaitHello, CheckedIn, Dropped } state = State::WaitAuth;
  handshake::Challenge challenge;  // rank 0: the one it sent
  int rank = -1;
  Deadline deadline = Deadline::never();
};

struct PendingSend {
  OpState op;
  void* request = nullptr;
  int peer = -1;
  std::unique_ptr<uint8_t[]> data;
  size_t bytes = 0;
};

class UcxBootstrap final : public Bootstrap, public mesh::Interruptible {
 public:
  explicit UcxBootstrap(const Config& config);
  ~UcxBootstrap() override;

  std::string_view backend() const noexcept override { return "ucx"; }
  int rank() const noexcept override { return launch_.rank; }
  int size() const noexcept override { return launch_.size; }
  int localRank() const noexcept override { return launch_.localRank; }
  int localSize() const noexcept override { return launch_.localSize; }
  void send(int peer, int tag, const void* data, size_t bytes) override;
  void recv(int peer, int tag, void* data, size_t bytes) override;
  void allGather(void* data, size_t bytesPerRank) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override;
  void abort(std::string_view reason) noexcept override;
  /// Ends this rank's calls in progress (Communicator::revoke; see mesh::PeerMesh::interrupt).
  bool interruptCalls(const Error& why) noexcept override;
  mesh::InterruptKey interruptKey() const noexcept override { return {this, &interrupts_}; }

  static void onPeerError(void* arg, ucp_ep_h ep, ucs_status_t status);

 private:
  using Lock = std::unique_lock<std::mutex>;

  // Set-up and tear-down.
  void initUcx();
  void teardown() noexcept;
  std::vector<net::Fd> serveInheritedSocket(int fd);
  void serveRendezvous(const std::vector<net::SockAddr>& rootAddrs, const Deadline& deadline,
                       std::vector<net::Fd>* held);
  void checkIn(const std::vector<net::SockAddr>& rootAddrs, const std::vector<uint8_t>& myAddress);
  bool checkInOverTcp(const std::vector<net::SockAddr>& rootAddrs,
                      const std::vector<uint8_t>& hello, double& probeWait);
  static void onConnRequest(ucp_conn_request_h request, void* arg);
  static void onRvError(void* arg, ucp_ep_h ep, ucs_status_t status);
  void rvSend(Lock& lk, RvConn& c, uint32_t step, std::vector<uint8_t> record);
  bool rvTryRecv(Lock& lk, uint64_t tag, uint64_t mask, std::vector<uint8_t>& out,
                 uint64_t* senderTag = nullptr);
  bool rvWait(Lock& lk, RvConn& c, uint64_t tag, uint64_t mask, const Deadline& deadline,
              std::vector<uint8_t>& out, uint64_t* senderTag = nullptr);
  void rvClose(Lock& lk, bool force);
  // The strata handshake over UCX (ucx_handshake.cpp). Rank 0: a connection request becomes
  // an RvConn that was sent its CHALLENGE (nullptr if UCX refused it); then each AUTH is
  // answered (the reason to drop the connection, or "" while it waits or once it passed).
  RvConn* rvAccept(Lock& lk, ucp_conn_request_h request);
  std::string rvServeAuth(Lock& lk, RvConn& c);
  // A client: answers rank 0's CHALLENGE and checks its RESULT; false if rank 0 went away or
  // stalled before either (start over), throws AuthFailed/ProtocolError.
  bool rvAuthenticate(Lock& lk, RvConn& c, const Deadline& deadline, const std::string& what);
  void exchangeTable();

  // Engine; every function below runs with mu_ held.
  Deadline callDeadline() const { return Deadline::fromTimeout(timeout_); }
  void progress(Lock& lk);
  void blockOnce(Lock& lk, const Deadline& deadline, int capMs);
  void progressLoop();
  template <class Done, class OnTimeout>
  void waitUntil(Lock& lk, const Deadline& deadline, int peer, Done done, OnTimeout onTimeout,
                 std::string_view op, Kind kind, int tag);
  ucp_ep_h endpoint(int peer);
  void startSend(Lock& lk, int peer, uint64_t tag, const void* data, size_t bytes,
                 const Deadline& deadline, std::string_view op, Kind kind, int userTag);
  /// Receives exactly `bytes` (or any size when exact is false; the size goes to *got).
  void recvTagged(Lock& lk, int peer, uint64_t tag, void* data, size_t bytes,
                  const Deadline& deadline, std::string_view op, Kind kind, int userTag,
                  std::vector<uint8_t>* any = nullptr);
  void sendInternal(Lock& lk, int peer, Kind kind, uint32_t low, const void* data, size_t bytes,
                    const Deadline& deadline, std::string_view op);
  void recvInternal(Lock& lk, int peer, Kind kind, uint32_t low, void* data, size_t bytes,
                    const Deadline& deadline, std::string_view op);
  /// Copies `bytes` and sends them with `tag`; the copy stays in sends_ until UCX is done
  /// (peer -1: reapSends attributes no failure to a rank). UCS_OK, or ucp_tag_send_nbx's error.
  ucs_status_t postSend(ucp_ep_h ep, int peer, uint64_t tag, const void* data, size_t bytes);
  /// Closes the endpoints (force[i]: without flushing), waits up to 2 s for UCX, and sets each
  /// to nullptr.
  void closeEndpoints(Lock& lk, const std::vector<ucp_ep_h*>& eps, const std::vector<bool>& force);
  /// Receives the probed message `msg` into buffer (at most capacity bytes); completion goes
  /// to `state`. Returns the request (never completed in place) or an error pointer.
  void* recvProbed(ucp_tag_message_h msg, void* buffer, size_t capacity, OpState& state);
  void reapSends();
  void checkAbortMessage();
  [[noreturn]] void throwAborted() const;
  [[noreturn]] void throwInterrupted() const;
  bool lostLongEnough(int peer) const;
  [[noreturn]] void throwLost(int peer, std::string_view op, Kind kind, int tag) const;
  uint32_t nextCollective();
  /// One collective call's messages (see allGather).
  p2p::Messenger collectiveMessenger(Lock& lk, const Deadline& deadline, std::string_view op,
                                     bool tagRounds);
  void waitRequest(Lock& lk, void* request, std::unique_ptr<OpState>& state,
                   const Deadline& deadline, int peer, std::string_view op, Kind kind, int tag);

  LaunchInfo launch_;
  double timeout_ = 30;
  double connectTimeout_ = 60;
  double handshakeTimeout_ = 5;
  uint64_t maxMessage_ = uint64_t{1} << 30;
  std::string root_;

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  mesh::SpinPolicy spin_;
  std::vector<std::vector<uint8_t>> table_;
  std::vector<std::unique_ptr<Peer>> peers_;
  // The rendezvous: rank 0's listener, its connection requests not yet taken, and the
  // sockaddr endpoints of either side.
  ucp_listener_h listener_ = nullptr;
  std::vector<ucp_conn_request_h> connRequests_;
  std::vector<std::unique_ptr<RvConn>> rvConns_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool driving_ = false;
  bool stopping_ = false;
  std::thread progressThread_;
  std::list<std::unique_ptr<PendingSend>> sends_;
  // Receives that timed out and could not be cancelled (see waitRequest).
  std::vector<std::pair<void*, std::unique_ptr<OpState>>> orphans_;
  size_t inFlightBytes_ = 0;
  uint32_t collectiveSeq_ = 0;

  // The pre-posted receive that catches abort messages from any rank.
  void* abortRequest_ = nullptr;
  OpState abortOp_;
  std::vector<uint8_t> abortBuf_;
  bool aborted_ = false;
  // interruptCalls(): how many, and the last one's error (under mu_); see mesh::CallScope.
  std::atomic<uint64_t> interrupts_{0};
  std::optional<Error> interruptWhy_;
  int abortOrigin_ = -1;
  std::string abortReason_;
};

}  // namespace strata::ucx
