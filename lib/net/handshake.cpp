#include "net/handshake.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/wire.hpp"

namespace strata::handshake {
void writeRecord(int fd, const std::vector<uint8_t>& record, const Deadline& deadline,
                 std::string_view what) {
  net::writeFull(fd, record.data(), record.size(), deadline, what);
}

std::vector<uint8_t> readRecord(int fd, size_t maxBody, const Deadline& deadline,
                                std::string_view what) {
  std::vector<uint8_t> buf(wire::kRecordHeaderSize);
  net::readFull(fd, buf.data(), buf.size(), deadline, what);
  auto h = wire::decodeHeader(buf, 0xffff, maxBody, what);
  buf.resize(wire::kRecordHeaderSize + h.length);
  net::readFull(fd, buf.data() + wire::kRecordHeaderSize, h.length, deadline, what);
  return buf;
}

void connectSide(int fd, std::string_view secret, Purpose purpose, int rank, int size,
                 int expectedListenerRank, const Deadline& deadline, std::string_view what) {
  auto challenge = decodeChallenge(readRecord(fd, kMaxChallengeBody, deadline, what), what);
  checkChallenge(challenge, purpose, expectedListenerRank, what);
  auto auth = makeAuth(secret, challenge, rank, size);
  writeRecord(fd, encode(auth), deadline, what);
  auto result = decodeResult(readRecord(fd, kMaxResultBody, deadline, what), what);
  checkResult(result, secret, challenge, auth, what);
}

ListenSide::ListenSide(net::Fd fd, net::SockAddr remote, std::string_view secret, Purpose purpose,
                       int listenerRank, int size, const Deadline& deadline)
    : fd_(std::move(fd)),
      remote_(remote),
      secret_(secret),
      size_(size),
      deadline_(deadline),
      challenge_(makeChallenge(purpose, listenerRank)) {
  auto rec = encode(challenge_);
  // A fresh socket's send buffer always takes 49 bytes.
  ssize_t n = ::send(fd_.get(), rec.data(), rec.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n != static_cast<ssize_t>(rec.size())) {
    reject(fmt::format("could not send the challenge: {}", net::errnoText(errno)), false);
    probe_ = true;  // gone before it could have sent anything
  }
}

ListenSide::State ListenSide::reject(std::string reason, bool tellPeer) {
  reason_ = std::move(reason);
  if (tellPeer && fd_.valid()) {
    auto rec = encode(Result{false, {}, reason_});
    [[maybe_unused]] auto n =
        ::send(fd_.get(), rec.data(), rec.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  fd_.reset();
  state_ = State::Rejected;
  return state_;
}

ListenSide::State ListenSide::step() {
  if (state_ != State::InProgress) return state_;
  const size_t total = wire::kRecordHeaderSize + kAuthBody;
  while (in_.size() < total) {
    uint8_t buf[total];
    ssize_t n = ::recv(fd_.get(), buf, total - in_.size(), MSG_DONTWAIT);
    if (n > 0) {
      in_.insert(in_.end(), buf, buf + n);
      // Reject a bad header as soon as it is complete, without waiting for a body.
      if (in_.size() >= wire::kRecordHeaderSize && in_.size() - n < wire::kRecordHeaderSize) {
        try {
          auto h = wire::decodeHeader({in_.data(), wire::kRecordHeaderSize}, kVersion, kAuthBody,
                                      "handshake");
          if (h.kind != kAuthKind || h.length != kAuthBody) {
            return reject("unexpected handshake record", false);
          }
        } catch (const Error& e) {
          return reject(fmt::format("garbage instead of a handshake ({})", e.what()), false);
        }
      }
      continue;
    }
    if (n == 0) {
      probe_ = in_.empty();
      return reject(probe_ ? "closed the connection without sending anything (a port scan or "
                             "probe)"
                           : "closed the connection during the handshake",
                    false);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (deadline_.expired()) return reject("sent no complete handshake in time", false);
      return state_;
    }
    probe_ = in_.empty() && errno == ECONNRESET;
    return reject(fmt::format("read failed during the handshake: {}", net::errnoText(errno)),
                  false);
  }
  Auth auth;
  try {
    auth = decodeAuth(in_, "handshake");
  } catch (const Error& e) {
    return reject(fmt::format("garbage instead of a handshake ({})", e.what()), false);
  }
  std::string why = checkAuth(auth, secret_, challenge_, size_);
  if (!why.empty()) return reject(std::move(why), true);
  peerRank_ = auth.rank;
  auto rec = encode(acceptResult(secret_, challenge_, auth));
  ssize_t n = ::send(fd_.get(), rec.data(), rec.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n != static_cast<ssize_t>(rec.size())) {
    return reject("could not send the handshake result", false);
  }
  state_ = State::Accepted;
  return state_;
}

ConnectSide::ConnectSide(net::SockAddr addr, std::string_view secret, Purpose purpose, int rank,
                         int size, int expectedListenerRank, const Deadline& connectDeadline,
                         const Deadline& deadline, std::string what)
    : addr_(addr),
      secret_(secret),
      purpose_(purpose),
      rank_(rank),
      size_(size),
      expectedListener_(expectedListenerRank),
      connectDeadline_(Deadline::earlier(connectDeadline, deadline)),
      deadline_(deadline),
      what_(std::move(what)) {
  startConnect();
}

void ConnectSide::startConnect() {
  phase_ = Phase::Connecting;
  fd_ = net::Fd(::socket(addr_.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd_.valid()) {
    fail(ErrorCode::SystemError, fmt::format("{}: socket(): {}", what_, net::errnoText(errno)));
    return;
  }
  int rc = ::connect(fd_.get(), addr_.get(), addr_.len);
  if (rc == 0 || errno == EINPROGRESS || errno == EINTR) return;
  int err = errno;
  fd_.reset();
  phase_ = Phase::Waiting;
  retryAt_ = Deadline::after(backoff_);
  backoff_ = std::min(backoff_ * 2, 0.2);
  error_ = net::errnoText(err);
}

short ConnectSide::events() const {
  return phase_ == Phase::Connecting ? POLLOUT : POLLIN;
}

Deadline ConnectSide::wakeAt() const {
  Deadline d = phase_ == Phase::Waiting ? retryAt_ : Deadline::never();
  d = Deadline::earlier(d, deadline_);
  if (phase_ == Phase::Connecting || phase_ == Phase::Waiting) {
    d = Deadline::earlier(d, connectDeadline_);
  }
  return d;
}

ConnectSide::State ConnectSide::fail(ErrorCode code, std::string message) {
  fd_.reset();
  errorCode_ = code;
  error_ = std::move(message);
  state_ = State::Failed;
  return state_;
}

ConnectSide::State ConnectSide::step() {
  while (state_ == State::InProgress) {
    if (deadline_.expired()) {
      return fail(
          ErrorCode::Timeout,
          fmt::format(
              "{}: timed out during the {}", what_,
              phase_ == Phase::Connecting || phase_ == Phase::Waiting ? "connect" : "handshake"));
    }
    switch (phase_) {
      case Phase::Waiting:
        if (connectDeadline_.expired()) {
          return fail(ErrorCode::PeerLost,
                      fmt::format("{}: connection refused ({}); nothing listens there any more",
                                  what_, error_));
        }
        if (!retryAt_.expired()) return state_;
        startConnect();
        continue;
      case Phase::Connecting: {
        pollfd p{fd_.get(), POLLOUT, 0};
        if (::poll(&p, 1, 0) <= 0) {
          if (connectDeadline_.expired()) {
            return fail(ErrorCode::PeerLost, fmt::format("{}: connect timed out", what_));
          }
          return state_;
        }
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          fd_.reset();
          error_ = net::errnoText(err);
          phase_ = Phase::Waiting;
          retryAt_ = Deadline::after(backoff_);
          backoff_ = std::min(backoff_ * 2, 0.2);
          continue;
        }
        net::setNoDelay(fd_.get());
        phase_ = Phase::ReadChallenge;
        continue;
      }
      case Phase::ReadChallenge: {
        const size_t total = wire::kRecordHeaderSize + kChallengeBody;
        uint8_t buf[64];
        ssize_t n = ::recv(fd_.get(), buf, total - in_.size(), MSG_DONTWAIT);
        if (n == 0) {
          return fail(ErrorCode::PeerLost,
                      fmt::format("{}: the listener closed the connection", what_));
        }
        if (n < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) return state_;
          return fail(ErrorCode::PeerLost, fmt::format("{}: {}", what_, net::errnoText(errno)));
        }
        in_.insert(in_.end(), buf, buf + n);
        if (in_.size() < total) continue;
        try {
          challenge_ = decodeChallenge(in_, what_);
          checkChallenge(challenge_, purpose_, expectedListener_, what_);
        } catch (const Error& e) {
          return fail(ErrorCode::ProtocolError, e.what());
        }
        auth_ = makeAuth(secret_, challenge_, rank_, size_);
        auto rec = encode(auth_);
        ssize_t sent = ::send(fd_.get(), rec.data(), rec.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent != static_cast<ssize_t>(rec.size())) {
          return fail(ErrorCode::PeerLost, fmt::format("{}: could not send the handshake", what_));
        }
        in_.clear();
        phase_ = Phase::ReadResult;
        continue;
      }
      case Phase::ReadResult: {
        size_t want = in_.size() < wire::kRecordHeaderSize ? wire::kRecordHeaderSize : resultNeed_;
        if (in_.size() >= wire::kRecordHeaderSize && in_.size() >= want) {
          try {
            checkResult(decodeResult(in_, what_), secret_, challenge_, auth_, what_);
          } catch (const Error& e) {
            return fail(e.code(), e.what());
          }
          state_ = State::Done;
          return state_;
        }
        size_t old = in_.size();
        in_.resize(want);
        ssize_t n = ::recv(fd_.get(), in_.data() + old, want - old, MSG_DONTWAIT);
        if (n <= 0) {
          in_.resize(old);
          if (n == 0) {
            return fail(ErrorCode::PeerLost,
                        fmt::format("{}: the listener closed the connection", what_));
          }
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) return state_;
          return fail(ErrorCode::PeerLost, fmt::format("{}: {}", what_, net::errnoText(errno)));
        }
        in_.resize(old + static_cast<size_t>(n));
        if (old < wire::kRecordHeaderSize && in_.size() == wire::kRecordHeaderSize) {
          try {
            auto h = wire::decodeHeader(in_, kVersion, kMaxResultBody, what_);
            resultNeed_ = wire::kRecordHeaderSize + h.length;
          } catch (const Error& e) {
            return fail(ErrorCode::ProtocolError, e.what());
          }
        }
        continue;
      }
    }
  }
  return state_;
}

bool RecordReader::step(int fd, std::string_view what) {
  for (;;) {
    size_t want = buf_.size() < wire::kRecordHeaderSize ? wire::kRecordHeaderSize : need_;
    if (buf_.size() >= want && buf_.size() >= wire::kRecordHeaderSize) return true;
    size_t old = buf_.size();
    buf_.resize(want);
    ssize_t n = ::recv(fd, buf_.data() + old, want - old, MSG_DONTWAIT);
    if (n > 0) {
      buf_.resize(old + static_cast<size_t>(n));
      if (old < wire::kRecordHeaderSize && buf_.size() == wire::kRecordHeaderSize) {
        auto h = wire::decodeHeader(buf_, 0xffff, maxBody_, what);
        need_ = wire::kRecordHeaderSize + h.length;
        if (h.length == 0) return true;
      }
      continue;
    }
    buf_.resize(old);
    if (n == 0) throw Error(ErrorCode::PeerLost, fmt::format("{}: connection closed", what));
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    throw Error(ErrorCode::PeerLost,
                fmt::format("{}: read failed: {}", what, net::errnoText(errno)));
  }
}

}  // namespace strata::handshake
