#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "net/handshake.hpp is internal to strata: applications include <strata/...> only"
#endif

// Connection authentication shared by every socket-based bootstrap listener: an HMAC-SHA256
// challenge-response over the job secret (docs/wire-format.md, "Handshake"), over sockets. The
// records and their checks are in handshake_codec.hpp.
//
// The listener side is a non-blocking state machine so that a stalled or hostile connection
// never delays another; the connector side blocks with a deadline.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <strata/error.hpp>
#include <strata/export.hpp>

#include "base/deadline.hpp"
#include "net/handshake_codec.hpp"
#include "net/socket.hpp"

namespace strata::handshake {

/// Authenticates a freshly connected socket as `rank` of `size`. Throws AuthFailed when the
/// listener rejects us or cannot prove the secret, ProtocolError for garbage, Timeout/PeerLost.
STRATA_API void connectSide(int fd, std::string_view secret, Purpose purpose, int rank, int size,
                            int expectedListenerRank, const Deadline& deadline,
                            std::string_view what);

/// One accepted connection going through the handshake without blocking.
class STRATA_API ListenSide {
 public:
  enum class State { InProgress, Accepted, Rejected };

  ListenSide(net::Fd fd, net::SockAddr remote, std::string_view secret, Purpose purpose,
             int listenerRank, int size, const Deadline& deadline);
  /// Call when the socket is readable (or periodically); never blocks.
  State step();
  int fd() const { return fd_.get(); }
  const Deadline& deadline() const { return deadline_; }
  /// After Accepted: the authenticated rank. After Rejected: why (for the warn log).
  int peerRank() const { return peerRank_; }
  const std::string& reason() const { return reason_; }
  /// After Rejected: the peer went away without sending a byte (a port scan, a health check):
  /// worth a debug line, not a warning per connection.
  bool probe() const { return probe_; }
  const net::SockAddr& remote() const { return remote_; }
  net::Fd takeFd() { return std::move(fd_); }
  State state() const { return state_; }

 private:
  State reject(std::string reason, bool tellPeer);
  net::Fd fd_;
  net::SockAddr remote_;
  std::string secret_;
  int size_;
  Deadline deadline_;
  Challenge challenge_;
  std::vector<uint8_t> in_;
  int peerRank_ = -1;
  std::string reason_;
  bool probe_ = false;
  State state_ = State::InProgress;
};

/// The connecting side as a non-blocking state machine, for engines that must keep serving
/// their own listener while they connect (two ranks connecting to each other at once).
/// Refused connections are retried with capped back-off until `connectDeadline`.
class STRATA_API ConnectSide {
 public:
  enum class State { InProgress, Done, Failed };

  ConnectSide(net::SockAddr addr, std::string_view secret, Purpose purpose, int rank, int size,
              int expectedListenerRank, const Deadline& connectDeadline, const Deadline& deadline,
              std::string what);
  /// Advances on readiness or timers; never blocks.
  State step();
  State state() const { return state_; }
  /// The socket to poll (-1 while waiting to retry) and the events to poll for.
  int fd() const { return fd_.get(); }
  short events() const;
  /// When step() must run again even without an event.
  Deadline wakeAt() const;
  net::Fd takeFd() { return std::move(fd_); }
  /// After Failed.
  ErrorCode errorCode() const { return errorCode_; }
  const std::string& error() const { return error_; }

 private:
  enum class Phase { Connecting, Waiting, ReadChallenge, ReadResult };
  State fail(ErrorCode code, std::string message);
  void startConnect();
  net::SockAddr addr_;
  std::string secret_;
  Purpose purpose_;
  int rank_, size_, expectedListener_;
  Deadline connectDeadline_, deadline_;
  std::string what_;
  net::Fd fd_;
  Phase phase_ = Phase::Connecting;
  State state_ = State::InProgress;
  Deadline retryAt_ = Deadline::never();
  double backoff_ = 0.001;
  std::vector<uint8_t> in_;
  Challenge challenge_;
  Auth auth_;
  size_t resultNeed_ = 0;
  ErrorCode errorCode_ = ErrorCode::Internal;
  std::string error_;
};

/// Non-blocking accumulation of one length-prefixed wire record from a socket.
class STRATA_API RecordReader {
 public:
  RecordReader(size_t maxBody) : maxBody_(maxBody) {}
  /// Reads what is available; returns true when a whole record is buffered. Throws
  /// ProtocolError (bad header/too long) or PeerLost (EOF) naming `what`.
  bool step(int fd, std::string_view what);
  const std::vector<uint8_t>& record() const { return buf_; }
  void reset() {
    buf_.clear();
    need_ = 0;
  }

 private:
  size_t maxBody_;
  std::vector<uint8_t> buf_;
  size_t need_ = 0;
};

/// Writes a whole record with a deadline (blocking on a non-blocking socket).
STRATA_API void writeRecord(int fd, const std::vector<uint8_t>& record, const Deadline& deadline,
                            std::string_view what);
/// Reads one whole record (header + body <= maxBody) with a deadline.
STRATA_API std::vector<uint8_t> readRecord(int fd, size_t maxBody, const Deadline& deadline,
                                           std::string_view what);

}  // namespace strata::handshake
