#include <fmt/format.h>

#include <strata/error.hpp>

#include "context_impl.hpp"

namespace strata {

Connection::Connection(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Connection::~Connection() = default;

int Connection::peer() const noexcept {
  return impl_->peer;
}
std::string_view Connection::transport() const noexcept {
  return impl_->transportName;
}

void Connection::Impl::checkLost() {
  if (revocation) revocation->check();
  if (lost) throw Error(ErrorCode::PeerLost, lostMessage, peer);
}

template <typename F>
void Connection::Impl::guarded(F&& fn) {
  std::lock_guard lk(mu);
  checkLost();
  try {
    fn();
  } catch (const Error& e) {
    if (e.code() == ErrorCode::PeerLost) {
      lost = true;
      lostMessage = e.what();
    }
    throw;
  }
}

namespace {

bool rangeOk(uint64_t offset, uint64_t bytes, uint64_t size) {
  return offset <= size && bytes <= size - offset;
}

}  // namespace

void Connection::write(const RegisteredMemory& dst, uint64_t dstOffset, const RegisteredMemory& src,
                       uint64_t srcOffset, size_t bytes) {
  auto& I = *impl_;
  auto fail = [&](const std::string& why) {
    throw Error(
        ErrorCode::InvalidArgument,
        fmt::format("Connection::write to rank {} over {}: {}", I.peer, I.transportName, why),
        I.peer);
  };
  if (!dst || dst.isLocal()) fail("dst must be the peer's memory (a deserialized record)");
  if (!src || !src.isLocal()) fail("src must be local registered memory");
  if (dst.rank() != I.peer) fail(fmt::format("dst belongs to rank {}", dst.rank()));
  if (transport::Access::impl(dst)->remoteTransport != I.transportName) {
    fail(fmt::format("dst was imported through {}", transport::Access::impl(dst)->remoteTransport));
  }
  auto* local = transport::Access::impl(src)->localFor(I.transportName);
  if (!local) fail("src is not registered with this transport");
  if (!rangeOk(dstOffset, bytes, dst.size())) {
    fail(fmt::format("{} bytes at offset {} exceed the {}-byte dst", bytes, dstOffset, dst.size()));
  }
  if (!rangeOk(srcOffset, bytes, src.size())) {
    fail(fmt::format("{} bytes at offset {} exceed the {}-byte src", bytes, srcOffset, src.size()));
  }
  if (bytes == 0) return;
  backend::RemoteRef d{dst.size(), dst.kind(), transport::Access::impl(dst)->remote.get()};
  backend::LocalRef s{src.data(), src.size(), src.kind(), local};
  I.guarded([&] { I.conn->write(d, dstOffset, s, srcOffset, bytes); });
}

void Connection::updateAndSync(const RegisteredMemory& dst, uint64_t dstOffset, uint64_t value) {
  auto& I = *impl_;
  auto fail = [&](const std::string& why) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("Connection::updateAndSync to rank {} over {}: {}", I.peer,
                            I.transportName, why),
                I.peer);
  };
  if (!dst || dst.isLocal()) fail("dst must be the peer's memory (a deserialized record)");
  if (dst.rank() != I.peer) fail(fmt::format("dst belongs to rank {}", dst.rank()));
  if (transport::Access::impl(dst)->remoteTransport != I.transportName) {
    fail(fmt::format("dst was imported through {}", transport::Access::impl(dst)->remoteTransport));
  }
  if (dstOffset % 8 != 0) fail(fmt::format("offset {} is not 8-byte aligned", dstOffset));
  if (!rangeOk(dstOffset, 8, dst.size())) {
    fail(fmt::format("offset {} is past the {}-byte dst", dstOffset, dst.size()));
  }
  backend::RemoteRef d{dst.size(), dst.kind(), transport::Access::impl(dst)->remote.get()};
  I.guarded([&] { I.conn->updateAndSync(d, dstOffset, value); });
}

void Connection::flush(double timeoutSeconds) {
  auto& I = *impl_;
  double t = timeoutSeconds < 0 ? I.timeout : timeoutSeconds;
  watch::Call call(I.scope, "connection", "flush", 0);
  watch::waitingFor(I.peer, fmt::format("writes to it not yet complete over {}", I.transportName));
  try {
    I.guarded([&] { I.conn->flush(t > 0 ? t : 1e18); });
  } catch (const Error& e) {
    // Stuck on the peer: ask the job who is at fault (bounded by watch.query_timeout).
    if (e.code() == ErrorCode::Timeout) throw watch::diagnose(e);
    throw;
  }
}

void Connection::progress() {
  auto& I = *impl_;
  std::unique_lock lk(I.mu, std::try_to_lock);
  if (!lk.owns_lock() || I.lost) return;  // someone else is driving it
  try {
    I.conn->progress();
  } catch (const Error& e) {
    if (e.code() == ErrorCode::PeerLost) {
      I.lost = true;
      I.lostMessage = e.what();
    }
  }
}

void Connection::checkPeer() {
  auto& I = *impl_;
  I.guarded([&] { I.conn->checkPeer(); });
}

}  // namespace strata
