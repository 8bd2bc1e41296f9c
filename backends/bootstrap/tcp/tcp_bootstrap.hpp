#pragma once

// The TCP bootstrap: rank 0 serves the rendezvous; every rank keeps one persistent,
// authenticated connection per peer and direction, identified by its handshake.

#include <memory>
#include <string>

#include <strata/bootstrap.hpp>
#include <strata/config.hpp>
#include <strata/export.hpp>

#include "launch/contract.hpp"
#include "mesh/peer_mesh.hpp"

namespace strata::tcp {

class STRATA_API TcpBootstrap final : public Bootstrap, public mesh::Interruptible {
 public:
  /// Reads the launcher contract (launch/contract.hpp) and the config, then runs the rendezvous.
  explicit TcpBootstrap(const Config& config);
  /// An explicit launch (createTcpBootstrap): the environment is not read. rootFd, when >= 0, is
  /// rank 0's listening socket, owned by the caller.
  TcpBootstrap(const Config& config, const LaunchInfo& launch);
  ~TcpBootstrap() override;

  std::string_view backend() const noexcept override { return "tcp"; }
  int rank() const noexcept override;
  int size() const noexcept override;
  int localRank() const noexcept override;
  int localSize() const noexcept override;
  void send(int peer, int tag, const void* data, size_t bytes) override;
  void recv(int peer, int tag, void* data, size_t bytes) override;
  void allGather(void* data, size_t bytesPerRank) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override;
  void abort(std::string_view reason) noexcept override;
  /// Ends this rank's bootstrap calls in progress (PeerMesh::interrupt).
  bool interruptCalls(const Error& why) noexcept override;
  mesh::InterruptKey interruptKey() const noexcept override;

  /// "127.0.0.1:40123": where this rank accepts peer connections (for tests and diagnostics).
  std::string listenAddress() const;
  /// The rendezvous address (STRATA_ROOT or bootstrap.tcp.root).
  std::string rootAddress() const;
  /// Seconds the rendezvous took on this rank.
  double rendezvousSeconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::tcp
