#pragma once

// The libfabric transport (strata-transport-fabric.so): RDM endpoint, one-sided fi_write into
// registered peer memory, a background progress thread for providers with manual progress.
// docs/transport-fabric.md describes the choices; this header only declares the pieces. The
// endpoint, CQ and memory regions are in fabric_endpoint.hpp, the progress thread in
// fabric_progress.hpp.

#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include <strata/backend/transport.hpp>

#include "fabric_endpoint.hpp"
#include "fabric_progress.hpp"

namespace strata::fabric {

class FabricTransport final : public backend::Transport {
 public:
  explicit FabricTransport(const backend::TransportInit& init);
  ~FabricTransport() override;

  std::string_view name() const noexcept override { return "fabric"; }
  bool canReach(const backend::PeerInfo& peer) const noexcept override;
  bool supportsMemory(MemoryKind kind) const noexcept override;
  std::unique_ptr<backend::LocalMemory> registerMemory(
      void* data, size_t bytes, MemoryKind kind, const backend::HostAllocation* host) override;
  std::unique_ptr<backend::RemoteMemory> importMemory(const backend::PeerInfo& owner,
                                                      std::span<const uint8_t> descriptor,
                                                      size_t bytes, MemoryKind kind) override;
  std::vector<uint8_t> endpoint() override;
  std::unique_ptr<backend::TransportConnection> connect(
      const backend::PeerInfo& peer, std::span<const uint8_t> peerEndpoint) override;
  backend::TransportStats stats() const noexcept override;
  bool blockingWaitSupported() const noexcept override;
  bool waitSignal(const backend::LocalRef& mem, uint64_t offset, uint64_t above,
                  double maxSeconds) override;

 private:
  std::shared_ptr<Endpoint> endpoint_;
  std::unique_ptr<ProgressThread> progress_;
};

}  // namespace strata::fabric
