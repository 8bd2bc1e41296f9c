#pragma once

// The PMIx bootstrap (strata-bootstrap-pmix.so): identity from the PMIx server, collectives as
// PMIx fences, point-to-point over the shared peer mesh (mesh/peer_mesh.hpp). docs/backends.md
// explains the design.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <strata/bootstrap.hpp>
#include <strata/config.hpp>

#include "mesh/peer_mesh.hpp"

namespace strata::pmix {

/// Record kind of the values this backend puts into PMIx (docs/backends.md).
inline constexpr uint16_t kValueKind = 40;
inline constexpr uint16_t kValueVersion = 1;

class PmixBootstrap final : public Bootstrap, public mesh::Interruptible {
 public:
  /// Joins the PMIx job, opens a mesh listener on bootstrap.tcp.interface and exchanges the
  /// listener addresses and rank 0's job secret in one collecting fence.
  explicit PmixBootstrap(const Config& config);
  /// Closes the mesh, then drops this bootstrap's PMIx reference.
  ~PmixBootstrap() override;

  std::string_view backend() const noexcept override { return "pmix"; }
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
  /// Ends this rank's calls in progress on the mesh (point to point); a PMIx fence in progress
  /// ends by its own deadline.
  bool interruptCalls(const Error& why) noexcept override;
  mesh::InterruptKey interruptKey() const noexcept override;

  /// Where this rank's mesh listener accepts peers ("127.0.0.1:40123"; "" when size is 1).
  std::string listenAddress() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// True when a PMIx server announced itself in the environment (PMIX_SERVER_URI*, or
/// PMIX_NAMESPACE).
bool detectServer() noexcept;

}  // namespace strata::pmix
