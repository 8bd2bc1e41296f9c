#include "base/handshake.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/hmac.hpp"
#include "base/wire.hpp"

namespace strata::handshake {
namespace {

constexpr uint16_t kChallenge = 1;
constexpr uint16_t kAuth = 2;
constexpr uint16_t kResult = 3;
constexpr uint16_t kVersion = 1;
constexpr size_t kAuthBody = 1 + 4 + 4 + 32 + 32;
constexpr size_t kMaxReason = 512;


std::string_view purposeName(Purpose p) {
  return p == Purpose::Rendezvous ? "rendezvous" : "peer";
}

}  // namespace

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
  auto chRec = readRecord(fd, 64, deadline, what);
  auto ch = wire::decodeRecord(chRec, kChallenge, kVersion, 64, what);
  wire::Reader r(ch.body, fmt::format("{} challenge", what));
  auto p = static_cast<Purpose>(r.u8());
  int listenerRank = r.i32();
  Nonce nl;
  auto raw = r.raw(32);
  std::copy(raw.begin(), raw.end(), nl.begin());
  r.expectEnd();
  if (p != purpose) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("{}: the listener serves {} connections, expected {}", what,
                            purposeName(p), purposeName(purpose)));
  }
  if (expectedListenerRank >= 0 && listenerRank != expectedListenerRank) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("{}: reached rank {} but expected rank {} (stale address?)", what,
                            listenerRank, expectedListenerRank),
                expectedListenerRank);
  }
  Nonce nc;
  crypto::randomBytes(nc);
  auto m = authMac(secret, 'C', purpose, nl, nc, rank, size, listenerRank, 0);
  wire::Writer w;
  w.u8(static_cast<uint8_t>(purpose)).i32(rank).i32(size).raw(nc).raw(m);
  writeRecord(fd, wire::encodeRecord(kAuth, kVersion, w.data()), deadline, what);

  auto resRec = readRecord(fd, 32 + 1 + 4 + kMaxReason, deadline, what);
  auto res = wire::decodeRecord(resRec, kResult, kVersion, 32 + 1 + 4 + kMaxReason, what);
  wire::Reader rr(res.body, fmt::format("{} result", what));
  uint8_t ok = rr.u8();
  auto sm = rr.raw(32);
  std::string reason = rr.str(kMaxReason);
  rr.expectEnd();
  if (!ok) {
    throw Error(ErrorCode::AuthFailed,
                fmt::format("{}: rank {} refused the connection: {}", what, listenerRank, reason),
                listenerRank);
  }
  auto expect = authMac(secret, 'S', purpose, nl, nc, rank, size, listenerRank, 1);
  if (!crypto::equalConstantTime(expect, sm)) {
    throw Error(ErrorCode::AuthFailed,
                fmt::format("{}: the listener could not prove the job secret (another job on "
                            "this port, or a different STRATA_SECRET)",
                            what),
                listenerRank);
  }
}

ListenSide::ListenSide(net::Fd fd, net::SockAddr remote, std::string_view secret,
                       Purpose purpose, int listenerRank, int size, const Deadline& deadline)
    : fd_(std::move(fd)),
      remote_(remote),
      secret_(secret),
      purpose_(purpose),
      listenerRank_(listenerRank),
      size_(size),
      deadline_(deadline) {
  crypto::randomBytes(nonceL_);
  wire::Writer w;
  w.u8(static_cast<uint8_t>(purpose_)).i32(listenerRank_).raw(nonceL_);
  auto rec = wire::encodeRecord(kChallenge, kVersion, w.data());
  // A fresh socket's send buffer always takes 49 bytes.
  ssize_t n = ::send(fd_.get(), rec.data(), rec.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n != static_cast<ssize_t>(rec.size())) {
    reject(fmt::format("could not send the challenge: {}", net::errnoText(errno)), false);
  }
}

ListenSide::State ListenSide::reject(std::string reason, bool tellPeer) {
  reason_ = std::move(reason);
  if (tellPeer && fd_.valid()) {
    wire::Writer w;
    crypto::Digest zero{};
    w.u8(0).raw(zero).str(reason_.substr(0, kMaxReason));
    auto rec = wire::encodeRecord(kResult, kVersion, w.data());
    [[maybe_unused]] auto n = ::send(fd_.get(), rec.data(), rec.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
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
          if (h.kind != kAuth || h.length != kAuthBody) {
            return reject("unexpected handshake record", false);
          }
        } catch (const Error& e) {
          return reject(fmt::format("garbage instead of a handshake ({})", e.what()), false);
        }
      }
      continue;
    }
    if (n == 0) return reject("closed the connection during the handshake", false);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (deadline_.expired()) return reject("sent no complete handshake in time", false);
      return state_;
    }
    return reject(fmt::format("read failed during the handshake: {}", net::errnoText(errno)),
                  false);
  }
  wire::Reader r({in_.data() + wire::kRecordHeaderSize, kAuthBody}, "handshake");
  auto p = static_cast<Purpose>(r.u8());
  int rank = r.i32();
  int size = r.i32();
  Nonce nc;
  auto raw = r.raw(32);
  std::copy(raw.begin(), raw.end(), nc.begin());
  auto m = r.raw(32);
  auto expect = authMac(secret_, 'C', purpose_, nonceL_, nc, rank, size, listenerRank_, 0);
  if (p != purpose_ || !crypto::equalConstantTime(expect, m)) {
    return reject("failed authentication (wrong job secret or not a strata peer)", true);
  }
  if (size != size_) {
    return reject(fmt::format("claims a job of {} ranks, this job has {} (two jobs sharing a "
                              "port, or mismatched launch)",
                              size, size_),
                  true);
  }
  if (rank < 0 || rank >= size_ || (purpose_ == Purpose::Mesh && rank == listenerRank_)) {
    return reject(fmt::format("claims an invalid rank {}", rank), true);
  }
  peerRank_ = rank;
  wire::Writer w;
  auto sm = authMac(secret_, 'S', purpose_, nonceL_, nc, rank, size, listenerRank_, 1);
  w.u8(1).raw(sm).str("");
  auto rec = wire::encodeRecord(kResult, kVersion, w.data());
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

short ConnectSide::events() const { return phase_ == Phase::Connecting ? POLLOUT : POLLIN; }

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
      return fail(ErrorCode::Timeout, fmt::format("{}: timed out during the {}", what_,
                                                  phase_ == Phase::Connecting ||
                                                          phase_ == Phase::Waiting
                                                      ? "connect"
                                                      : "handshake"));
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
        const size_t total = wire::kRecordHeaderSize + 1 + 4 + 32;
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
          auto ch = wire::decodeRecord(in_, kChallenge, kVersion, 64, what_);
          wire::Reader r(ch.body, fmt::format("{} challenge", what_));
          auto p = static_cast<Purpose>(r.u8());
          listenerRank_ = r.i32();
          auto raw = r.raw(32);
          std::copy(raw.begin(), raw.end(), nonceL_.begin());
          r.expectEnd();
          if (p != purpose_) {
            return fail(ErrorCode::ProtocolError,
                        fmt::format("{}: the listener serves {} connections, expected {}", what_,
                                    purposeName(p), purposeName(purpose_)));
          }
          if (expectedListener_ >= 0 && listenerRank_ != expectedListener_) {
            return fail(ErrorCode::ProtocolError,
                        fmt::format("{}: reached rank {} but expected rank {} (stale address?)",
                                    what_, listenerRank_, expectedListener_));
          }
        } catch (const Error& e) {
          return fail(ErrorCode::ProtocolError, e.what());
        }
        crypto::randomBytes(nonceC_);
        auto m = authMac(secret_, 'C', purpose_, nonceL_, nonceC_, rank_, size_, listenerRank_, 0);
        wire::Writer w;
        w.u8(static_cast<uint8_t>(purpose_)).i32(rank_).i32(size_).raw(nonceC_).raw(m);
        auto rec = wire::encodeRecord(kAuth, kVersion, w.data());
        ssize_t sent = ::send(fd_.get(), rec.data(), rec.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent != static_cast<ssize_t>(rec.size())) {
          return fail(ErrorCode::PeerLost, fmt::format("{}: could not send the handshake", what_));
        }
        in_.clear();
        phase_ = Phase::ReadResult;
        continue;
      }
      case Phase::ReadResult: {
        const size_t maxBody = 32 + 1 + 4 + kMaxReason;
        size_t want = in_.size() < wire::kRecordHeaderSize ? wire::kRecordHeaderSize : resultNeed_;
        if (in_.size() >= wire::kRecordHeaderSize && in_.size() >= want) {
          try {
            auto res = wire::decodeRecord(in_, kResult, kVersion, maxBody, what_);
            wire::Reader rr(res.body, fmt::format("{} result", what_));
            uint8_t ok = rr.u8();
            auto sm = rr.raw(32);
            std::string reason = rr.str(kMaxReason);
            rr.expectEnd();
            if (!ok) {
              return fail(ErrorCode::AuthFailed,
                          fmt::format("{}: rank {} refused the connection: {}", what_,
                                      listenerRank_, reason));
            }
            auto expect = authMac(secret_, 'S', purpose_, nonceL_, nonceC_, rank_, size_,
                              listenerRank_, 1);
            if (!crypto::equalConstantTime(expect, sm)) {
              return fail(ErrorCode::AuthFailed,
                          fmt::format("{}: the listener could not prove the job secret", what_));
            }
          } catch (const Error& e) {
            return fail(ErrorCode::ProtocolError, e.what());
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
            auto h = wire::decodeHeader(in_, kVersion, maxBody, what_);
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

std::array<uint8_t, 32> authMac(std::string_view secret, char side, Purpose purpose,
                                const Nonce& nl, const Nonce& nc, int rank, int size,
                                int listenerRank, uint8_t ok) {
  wire::Writer w;
  w.raw({reinterpret_cast<const uint8_t*>("strata-auth-v1"), 14});
  w.u8(static_cast<uint8_t>(side)).u8(static_cast<uint8_t>(purpose));
  w.raw(nl).raw(nc).i32(rank).i32(size).i32(listenerRank).u8(ok);
  return crypto::hmacSha256({reinterpret_cast<const uint8_t*>(secret.data()), secret.size()},
                            w.data());
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
