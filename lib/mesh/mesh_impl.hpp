#pragma once

// The state of a PeerMesh and the declarations its concerns share; private to lib/mesh. Each
// concern has its own file:
//   frame_io.cpp     reading and writing frames on one connection
//   progress.cpp     the driver loop: one waiting thread polls every socket, the others sleep
//   connections.cpp  lazy connect, accept, the handshake on both sides, peer addresses
//   failures.cpp     lost peers, goodbye, abort, LOST, and the errors that name them
//   peer_mesh.cpp    the public API: send, recv, the collectives over p2p, abort, close
// Every member function runs with `mu` held unless its comment says otherwise.

#include <poll.h>
#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <strata/error.hpp>

#include "base/deadline.hpp"
#include "mesh/frames.hpp"
#include "mesh/peer_mesh.hpp"
#include "net/handshake.hpp"
#include "net/socket.hpp"

namespace strata::mesh {

/// Small frames are read through a staging buffer of this size; larger payloads go straight
/// into their final buffer.
inline constexpr size_t kStageSize = 64u << 10;
/// The longest a waiting thread blocks in poll() or on the condition variable before it looks
/// at its deadline and the abort flag again.
inline constexpr int kPollCapMs = 1000;
/// An abort's reason is cut to this many bytes, well inside an ABORT frame's payload limit.
inline constexpr size_t kMaxAbortReason = 1024;

struct Message {
  std::unique_ptr<uint8_t[]> data;
  size_t size = 0;
};

struct OutFrame {
  std::vector<uint8_t> bytes;  // header + payload still to write
  size_t offset = 0;
  uint64_t seq = 0;
};

struct Conn {
  net::Fd fd;
  int peer = -1;
  bool outgoing = false;
  // Read side.
  uint8_t header[kFrameHeaderSize];
  size_t headerGot = 0;
  bool inPayload = false;
  FrameType type = FrameType::Data;
  int32_t tag = 0;
  Message payload;
  size_t payloadGot = 0;
  bool goodbye = false;
  // Write side.
  std::deque<OutFrame> outq;
  uint64_t queuedSeq = 0;
  uint64_t doneSeq = 0;
  // In the mesh's epoll set (closing the socket takes it out), with these events.
  bool registered = false;
  uint32_t armed = 0;
};

struct Peer {
  std::string address;
  std::unique_ptr<Conn> out;  // we send data on it
  std::unique_ptr<Conn> in;   // the peer sends data on it
  bool finished = false;      // said goodbye
  std::string goodbyeWhy;     // the failure its goodbye carried (empty: it finished well)
  bool lost = false;
  std::string lostWhy;
  ErrorCode lostCode = ErrorCode::PeerLost;
  std::unordered_map<int32_t, std::deque<Message>> inbox;
  std::unique_ptr<handshake::ConnectSide> connecting;
};

/// "tag 7", or the name of an internal tag, for error messages.
std::string tagText(int tag);

/// For a Timeout's message: what the kernel knows about the path to `peer` ("" when nothing
/// points at the network).
std::string pathHint(const Peer& p, int peer);

struct PeerMesh::Impl {
  Options opt;
  net::Fd listener;
  net::Fd wake;  // eventfd that interrupts the driver's poll()
  // The established connections (two per peer: 2 (N - 1) sockets) wait in an epoll set, so
  // that a wake-up costs what is ready, not a poll() over every socket: at 256 ranks on 2
  // cores, poll() over 510 sockets per wake-up made Communicator::create take 100 s.
  // poll() still watches the few others (wake, listener, handshakes) and the epoll fd itself.
  net::Fd epoll;
  std::vector<epoll_event> epollEvents = std::vector<epoll_event>(256);
  std::string listenAddr;
  std::vector<std::unique_ptr<Peer>> peers;
  std::list<handshake::ListenSide> pending;
  // Used by the driving thread only.
  std::vector<uint8_t> stage = std::vector<uint8_t>(kStageSize);
  std::vector<pollfd> pollFds;
  std::vector<std::list<handshake::ListenSide>::iterator> pollPending;
  std::vector<int> pollConnecting;

  std::mutex mu;
  std::condition_variable cv;
  bool driving = false;
  bool closed = false;
  bool closing = false;  // in close(): a peer that is gone has finished too, as far as we care
  bool aborted = false;
  std::string failure;  ///< the first Timeout or PeerLost of this rank's own calls (under mu)
  int abortOrigin = -1;
  std::string abortReason;
  bool abortedHere = false;  // by the engine itself, after a failure of this process
  std::mutex collMu;         // one engine collective at a time per process
  bool star = false;
  // PeerMesh::interrupt: how many there were, and the last one's error (under mu). A call that
  // began before the count changed gives up (CallScope).
  std::atomic<uint64_t> interrupts{0};
  std::optional<Error> interruptWhy;

  /// This thread is in a call on this mesh that began before the last interrupt.
  bool interruptedCall() const;
  [[noreturn]] void throwInterrupted();

  /// Calls f(conn) for every open connection, both directions of every peer.
  template <class F>
  void forEachOpenConn(F f) {
    for (auto& p : peers) {
      if (!p) continue;
      for (Conn* c : {p->out.get(), p->in.get()}) {
        if (c && c->fd.valid()) f(*c);
      }
    }
  }

  // ---- the public API's calls (peer_mesh.cpp; they take mu themselves) ----

  void send(int peer, int tag, const void* data, size_t bytes, const Deadline& deadline,
            std::string_view op, bool internal);
  void recv(int peer, int tag, void* data, size_t bytes, const Deadline& deadline,
            std::string_view op, bool internal);

  // ---- frames on one connection (frame_io.cpp) ----

  void queueFrame(Conn& c, FrameType type, int32_t tag, const uint8_t* data, size_t len);
  /// Reads what the socket has and hands every complete frame to dispatch().
  void readConn(Conn& c);
  /// Writes queued frames until the socket is full or the queue is empty.
  void writeConn(Conn& c);
  /// Validates a complete frame header and prepares the payload; false if it was refused.
  bool startFrame(Conn& c);
  void finishFrameIfComplete(Conn& c);
  void dispatch(Conn& c);

  // ---- progress (progress.cpp) ----

  /// Where a waiting thread is in its spin (bootstrap.spin_us) before it blocks.
  struct Spin {
    Deadline::Clock::time_point until;
    unsigned round = 0;
  };
  Spin startSpin() const {
    return {Deadline::Clock::now() + std::chrono::microseconds(opt.spinUs)};
  }

  /// Waits until done() holds, driving progress when no other thread does. onTimeout() is
  /// called (and must throw) once the deadline has passed. `expectFrom`: the peer whose
  /// message the caller waits for, read directly while spinning.
  template <class Done, class OnTimeout>
  void waitUntil(std::unique_lock<std::mutex>& lk, Done done, const Deadline& deadline,
                 OnTimeout onTimeout, int expectFrom = -1) {
    Spin spin = startSpin();
    for (;;) {
      if (done()) return;
      if (aborted) throwAborted();
      if (interruptedCall()) throwInterrupted();
      if (deadline.expired()) onTimeout();
      driveOrSleep(lk, deadline, spin, expectFrom);
    }
  }
  /// One step of waitUntil: a round of progress if no other thread drives, else a sleep until
  /// the driver hands over.
  void driveOrSleep(std::unique_lock<std::mutex>& lk, const Deadline& deadline, Spin& spin,
                    int expectFrom);
  /// One round of poll over every socket; releases mu while blocked in poll().
  void progressOnce(std::unique_lock<std::mutex>& lk, int timeoutMs);
  /// Drives progress until no frame is queued anywhere, or the deadline passes.
  void flushAll(std::unique_lock<std::mutex>& lk, const Deadline& deadline);
  void wakeDriver();
  /// Puts a connection in the epoll set, or updates what it waits for.
  void arm(Conn& c);

  // ---- connections (connections.cpp) ----

  /// The connection we send to `peer` on, made on first use.
  Conn& outgoing(std::unique_lock<std::mutex>& lk, int peer, const Deadline& deadline,
                 std::string_view op, int tag);
  void stepConnecting(int peer);
  void acceptAll();
  void stepPending(std::list<handshake::ListenSide>::iterator it);

  // ---- failures (failures.cpp) ----

  [[noreturn]] void throwAborted();
  /// The error of a call that needs `peer`, which is lost or has said goodbye.
  Error peerGone(int peer, std::string_view op, int tag);
  /// Remembers the first failure of this rank's own calls, for the goodbye (see close()).
  Error failed(Error e);
  void queueControlToAll(FrameType type, const std::vector<uint8_t>& body, const Conn* except);
  void markLost(int peer, std::string why, bool tellOthers);
  /// Fails this rank's later calls with Aborted from `origin` and passes the notice on to
  /// every connected peer but `except`.
  void enterAborted(int origin, std::string reason, const Conn* except);
  /// A failure of this process (out of descriptors), not of a peer.
  void failHere(std::string why);
  void closeConn(Conn& c, const std::string& why, bool tellOthers = true);
  void protocolViolation(Conn& c, const std::string& what);
  /// A connection made after this rank learnt of an abort carries the notice too.
  void tellAbortOnNewConnection(Conn& c);
  /// The control frames: a peer's goodbye, an abort (forwarded once), a LOST relay.
  void onGoodbye(Conn& c);
  void onAbort(Conn& c);
  void onLost(Conn& c);
};

}  // namespace strata::mesh
