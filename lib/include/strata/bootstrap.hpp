#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include <strata/config.hpp>
#include <strata/export.hpp>

namespace strata {

/// Lets the ranks of a job find each other and exchange small records.
///
/// Messages from one sender to one receiver with one tag arrive in the order sent; tags are
/// independent. recv() with a size other than the one sent throws ProtocolError. Every blocking
/// call honours bootstrap.timeout and throws Timeout; a dead peer gives PeerLost; abort() makes
/// the other ranks' calls throw Aborted. Calls from several threads at once are safe.
class STRATA_API Bootstrap {
 public:
  /// Picks the backend from bootstrap.backend (auto|tcp|pmix|ucx), connects, and checks that
  /// every rank made the same choices.
  static std::unique_ptr<Bootstrap> create(const Config& config = Config::load());
  virtual ~Bootstrap();
  virtual std::string_view backend() const noexcept = 0;  ///< "tcp", "pmix", "ucx"
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  virtual int localRank() const noexcept = 0;  ///< rank among the ranks on this host
  virtual int localSize() const noexcept = 0;
  /// Sends bytes to peer under tag (>= 0); never deadlocks against the peer's send.
  virtual void send(int peer, int tag, const void* data, size_t bytes) = 0;
  /// Receives exactly bytes from peer under tag.
  virtual void recv(int peer, int tag, void* data, size_t bytes) = 0;
  /// In place: slot r (bytesPerRank at offset r * bytesPerRank) holds rank r's contribution.
  virtual void allGather(void* data, size_t bytesPerRank) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  /// Makes every other rank's pending and later calls throw Aborted with this rank and reason.
  virtual void abort(std::string_view reason) noexcept = 0;
};

}  // namespace strata
