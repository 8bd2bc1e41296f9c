#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <strata/transport.hpp>

#include "internal.hpp"

namespace strata::transport {

/// Semaphore counters of one transport: one arena of kSlots 64-byte slots per Context.
struct SlotPool {
  static constexpr size_t kSlots = 4096;
  static constexpr size_t kStride = 64;
  RegisteredMemory arena;
  std::mutex mu;
  std::vector<bool> used = std::vector<bool>(kSlots, false);
  uint32_t acquire(int rank);
  void release(uint32_t slot) noexcept;
};

/// deserialize() through a given transport (empty: transportFor the owner).
RegisteredMemory deserializeWith(Context& context, std::span<const uint8_t> record,
                                 int expectedRank, std::string transportName);
void sendBlob(Bootstrap& b, int peer, int tag, const std::vector<uint8_t>& blob);
std::vector<uint8_t> recvBlob(Bootstrap& b, int peer, int tag, const char* what);

}  // namespace strata::transport

namespace strata {

struct Context::Impl {
  std::shared_ptr<Bootstrap> bootstrap;
  Config config;
  int rank = -1;
  int size = 0;
  double timeout = 30;
  std::vector<transport::HostRecord> hosts;
  std::vector<int> proxyCpus;  ///< transport.proxy_cpus resolved (Context::proxyCpus)
  int numaNode = -1;           ///< where allocate() prefers host memory (chooseNic)
  std::atomic<bool> numaFailureSaid{false};
  std::vector<std::string> intraList, interList;
  std::vector<transport::LoadedTransport> transports;
  std::map<std::string, std::string> failures;  ///< transport -> why it is not usable here
  std::mutex mu;
  std::map<std::string, std::shared_ptr<transport::SlotPool>> pools;
  std::shared_ptr<transport::Revocation> revocation = std::make_shared<transport::Revocation>();

  std::shared_ptr<backend::Transport> find(std::string_view name) const;
  backend::PeerInfo peerInfo(int peer) const;
  /// transportFor without the error (empty when there is none).
  std::string chooseTransport(int peer, MemoryKind kind) const;
  std::shared_ptr<transport::SlotPool> pool(const std::string& name, Context& context);
  void checkPeer(int peer, const char* what) const;
  RegisteredMemory registerImpl(void* data, size_t bytes, MemoryKind kind,
                                std::shared_ptr<transport::HostBlock> host,
                                std::shared_ptr<transport::DeviceBlock> device);
};

}  // namespace strata
