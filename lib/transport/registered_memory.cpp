#include <fmt/format.h>

#include <strata/error.hpp>

#include "context_impl.hpp"
#include "records.hpp"

namespace strata {

std::string_view toString(MemoryKind kind) noexcept {
  switch (kind) {
    case MemoryKind::Host:
      return "host";
    case MemoryKind::Cuda:
      return "cuda";
  }
  return "unknown";
}

RegisteredMemory::Impl::~Impl() {
  // Registrations go before the memory they describe (members die in reverse order, but
  // locals/remote are declared after the blocks, so be explicit).
  remote.reset();
  locals.clear();
}

backend::LocalMemory* RegisteredMemory::Impl::localFor(std::string_view name) const {
  for (const auto& l : locals) {
    if (l.name == name) return l.memory.get();
  }
  return nullptr;
}

RegisteredMemory::RegisteredMemory() = default;
RegisteredMemory::~RegisteredMemory() = default;
RegisteredMemory::RegisteredMemory(const RegisteredMemory&) = default;
RegisteredMemory& RegisteredMemory::operator=(const RegisteredMemory&) = default;
RegisteredMemory::RegisteredMemory(RegisteredMemory&&) noexcept = default;
RegisteredMemory& RegisteredMemory::operator=(RegisteredMemory&&) noexcept = default;
RegisteredMemory::RegisteredMemory(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

void* RegisteredMemory::data() const noexcept { return impl_ && impl_->local ? impl_->data : nullptr; }
size_t RegisteredMemory::size() const noexcept { return impl_ ? impl_->size : 0; }
MemoryKind RegisteredMemory::kind() const noexcept {
  return impl_ ? impl_->kind : MemoryKind::Host;
}
void* RegisteredMemory::hostPointer() const noexcept {
  if (!impl_ || impl_->kind != MemoryKind::Host) return nullptr;
  if (impl_->local) return impl_->data;
  return impl_->remote ? impl_->remote->hostPointer() : nullptr;
}
void* RegisteredMemory::devicePointer() const noexcept {
  if (!impl_ || impl_->kind != MemoryKind::Cuda) return nullptr;
  if (impl_->local) return impl_->data;
  return impl_->remote ? impl_->remote->devicePointer() : nullptr;
}
bool RegisteredMemory::isLocal() const noexcept { return impl_ && impl_->local; }
int RegisteredMemory::rank() const noexcept { return impl_ ? impl_->rank : -1; }

std::vector<std::string> RegisteredMemory::transports() const {
  std::vector<std::string> out;
  if (!impl_) return out;
  if (!impl_->local) return {impl_->remoteTransport};
  for (const auto& l : impl_->locals) out.push_back(l.name);
  return out;
}

std::vector<uint8_t> RegisteredMemory::serialize() const {
  if (!impl_ || !impl_->local) {
    throw Error(ErrorCode::InvalidArgument,
                "RegisteredMemory::serialize: only local registered memory can be serialized");
  }
  transport::MemoryRecord m;
  m.rank = impl_->rank;
  m.hostId = impl_->hostId;
  m.pid = impl_->pid;
  m.kind = impl_->kind;
  m.size = impl_->size;
  m.id = impl_->id;
  for (const auto& l : impl_->locals) m.entries.push_back({l.name, l.memory->descriptor()});
  if (m.entries.empty()) {
    throw Error(ErrorCode::NotSupported,
                fmt::format("rank {}: this {} buffer is registered with no transport (none of the "
                            "loaded ones handles {} memory)",
                            impl_->rank, toString(impl_->kind), toString(impl_->kind)));
  }
  return transport::encodeMemory(m);
}

namespace transport {

RegisteredMemory deserializeWith(Context& context, std::span<const uint8_t> record,
                                 int expectedRank, std::string transportName) {
  auto& I = transport::Access::impl(context);
  auto m = decodeMemory(record);
  if (m.rank < 0 || m.rank >= I.size) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("registered memory record names rank {}, but the job has {} ranks",
                            m.rank, I.size));
  }
  if (expectedRank >= 0 && m.rank != expectedRank) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("registered memory record is from rank {}, expected rank {}", m.rank,
                            expectedRank),
                m.rank);
  }
  const auto& owner = I.hosts[m.rank];
  if (m.hostId != owner.hostId || m.pid != owner.pid) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("registered memory record claims rank {} on host id {:#x} pid {}, but "
                            "rank {} runs on {} (host id {:#x}) as pid {}: a stale or foreign "
                            "record",
                            m.rank, m.hostId, m.pid, m.rank, owner.hostName, owner.hostId,
                            owner.pid),
                m.rank);
  }
  if (m.size == 0 || m.size > (uint64_t{1} << 48)) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("registered memory record from rank {} has size {}", m.rank, m.size),
                m.rank);
  }
  if (transportName.empty()) {
    if (m.rank == I.rank) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("RegisteredMemory::deserialize: the record is this rank's own "
                              "(rank {}); use the local object",
                              m.rank));
    }
    transportName = context.transportFor(m.rank, m.kind);
  }
  const MemoryRecord::Entry* entry = nullptr;
  for (const auto& e : m.entries) {
    if (e.transport == transportName) entry = &e;
  }
  if (!entry) {
    std::string have;
    for (const auto& e : m.entries) have += (have.empty() ? "" : ",") + e.transport;
    throw Error(ErrorCode::NotSupported,
                fmt::format("rank {}'s {} buffer is not registered with {}, which connects it to "
                            "rank {} (it has [{}]); register it after the Context loaded {}",
                            m.rank, toString(m.kind), transportName, I.rank, have, transportName),
                m.rank);
  }
  auto t = I.find(transportName);
  auto impl = std::make_shared<RegisteredMemory::Impl>();
  impl->local = false;
  impl->rank = m.rank;
  impl->size = m.size;
  impl->kind = m.kind;
  impl->id = m.id;
  impl->hostId = m.hostId;
  impl->pid = m.pid;
  impl->remoteTransport = transportName;
  impl->remoteOwner = t;
  impl->remote = t->importMemory(I.peerInfo(m.rank), entry->descriptor, m.size, m.kind);
  return RegisteredMemory(std::move(impl));
}

}  // namespace transport

RegisteredMemory RegisteredMemory::deserialize(Context& context, std::span<const uint8_t> record,
                                               int expectedRank) {
  return transport::deserializeWith(context, record, expectedRank, {});
}

}  // namespace strata
