#pragma once

// The nvlink transport: CUDA IPC between processes on one host (NVLink or PCIe, whatever the
// driver routes through), copies on a CUDA stream per connection. See docs/transport-nvlink.md.

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include <strata/backend/transport.hpp>

#include "nvlink_cuda.hpp"
#include "nvlink_records.hpp"

namespace strata::nvlink {

/// Live-object counters shared by the transport and the objects it hands out (which the core
/// may destroy after the transport).
struct Counters {
  std::atomic<size_t> registrations{0};
  std::atomic<size_t> imports{0};
  std::atomic<size_t> connections{0};
};

/// What this process knows about one visible CUDA device.
struct DeviceIdentity {
  int ordinal = -1;
  Uuid uuid{};
  std::string pciBusId;
};

class NvlinkTransport final : public backend::Transport {
 public:
  /// Throws NotSupported when there is no CUDA device or driver.
  explicit NvlinkTransport(const backend::TransportInit& init);
  ~NvlinkTransport() override;

  std::string_view name() const noexcept override { return "nvlink"; }
  bool canReach(const backend::PeerInfo& peer) const noexcept override { return peer.sameHost; }
  bool supportsMemory(MemoryKind kind) const noexcept override { return kind == MemoryKind::Cuda; }
  void* allocate(size_t bytes, MemoryKind kind) override;
  void deallocate(void* data, MemoryKind kind) noexcept override;
  std::unique_ptr<backend::LocalMemory> registerMemory(
      void* data, size_t bytes, MemoryKind kind, const backend::HostAllocation* host) override;
  std::unique_ptr<backend::RemoteMemory> importMemory(const backend::PeerInfo& owner,
                                                      std::span<const uint8_t> descriptor,
                                                      size_t bytes, MemoryKind kind) override;
  std::vector<uint8_t> endpoint() override;
  std::unique_ptr<backend::TransportConnection> connect(
      const backend::PeerInfo& peer, std::span<const uint8_t> peerEndpoint) override;
  MemoryKind signalMemoryKind() const noexcept override { return MemoryKind::Cuda; }
  uint64_t loadSignal(const backend::LocalRef& mem, uint64_t offset) override;
  backend::TransportStats stats() const noexcept override;

  int device() const noexcept { return self_.ordinal; }

 private:
  /// The identity of a visible device (cached; -1 gives an empty identity).
  DeviceIdentity identityOf(int ordinal) const;
  /// A visible device with that UUID, or nullptr (the peer's GPU may be hidden from us).
  const DeviceIdentity* findDevice(const Uuid& uuid) const;
  /// Lets this rank's GPU access ownerOrdinal's memory (a buffer of another GPU in this
  /// process): NotSupported naming both GPUs when they are not peers.
  void enablePeerAccess(int ownerOrdinal, const backend::PeerInfo& owner,
                        const MemoryDescriptor& d);

  DeviceIdentity self_;
  std::vector<DeviceIdentity> visible_;
  uint64_t hostId_ = 0;
  int rank_ = -1;
  double timeoutSeconds_ = 30;
  std::shared_ptr<Counters> counters_ = std::make_shared<Counters>();

  // loadSignal(): a private stream and a pinned word, so that reading a counter never waits
  // for the user's work on the legacy default stream.
  std::mutex signalMutex_;
  cudaStream_t signalStream_ = nullptr;
  uint64_t* signalSlot_ = nullptr;
};

}  // namespace strata::nvlink
