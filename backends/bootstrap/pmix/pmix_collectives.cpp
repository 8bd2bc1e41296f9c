// The pmix bootstrap's collectives: allGather and broadcast of up to kInlineMax bytes per rank
// as one PMIx data fence, larger ones over the peer mesh; barrier as one fence without data
// (docs/backends.md, "What comes from where" and "Fences and timeouts").

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "pmix_internal.hpp"

namespace strata::pmix {

// A collective holds a call of the mesh's (mesh::CallScope) from its start, so that a revoke's
// interrupt (PeerMesh::interrupt) ends its fence too, whether the mesh or PMIx carries it.
namespace {
WaitCheck interruptCheck(const mesh::PeerMesh* m) {
  if (!m) return {};
  return [m] { m->throwIfInterrupted(); };
}
}  // namespace

void PmixBootstrap::allGather(void* data, size_t bytesPerRank) {
  auto& I = *impl_;
  std::optional<mesh::CallScope> call;
  if (I.mesh) call.emplace(I.mesh->interruptKey());
  I.checkNotAborted();
  std::lock_guard lk(I.callMu);
  uint64_t seq = ++I.seq;
  if (I.size == 1) return;
  if (bytesPerRank > kInlineMax) {
    I.mesh->allGather(data, bytesPerRank);
    return;
  }
  auto* bytes = static_cast<uint8_t*>(data);
  const uint8_t* slot = bytes + bytesPerRank * static_cast<size_t>(I.rank);
  Value mine{Op::AllGather, I.instance, seq, I.rank,
             std::vector<uint8_t>(slot, slot + bytesPerRank)};
  auto rec = encodeValue(mine);
  auto others = I.others();
  auto values =
      dataFence(interruptCheck(I.mesh.get()), &rec, bytesPerRank, others, I.timeout, "allGather");
  for (size_t i = 0; i < others.size(); ++i) {
    int peer = others[i];
    auto payload = decodeValue(values[i], mine, peer);
    if (payload.size() != bytesPerRank) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("pmix bootstrap: allGather: rank {} contributed {} bytes, this rank "
                              "{} bytes per rank; every rank must pass the same size",
                              peer, payload.size(), bytesPerRank),
                  peer);
    }
    if (bytesPerRank > 0) {
      std::memcpy(bytes + bytesPerRank * static_cast<size_t>(peer), payload.data(), bytesPerRank);
    }
  }
}

void PmixBootstrap::broadcast(void* data, size_t bytes, int root) {
  auto& I = *impl_;
  std::optional<mesh::CallScope> call;
  if (I.mesh) call.emplace(I.mesh->interruptKey());
  if (root < 0 || root >= I.size) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("pmix bootstrap: broadcast root {} is not a rank of this job (0..{})",
                            root, I.size - 1));
  }
  I.checkNotAborted();
  std::lock_guard lk(I.callMu);
  uint64_t seq = ++I.seq;
  if (I.size == 1) return;
  if (bytes > kInlineMax) {
    I.mesh->broadcast(data, bytes, root);
    return;
  }
  auto* p = static_cast<uint8_t*>(data);
  Value expect{Op::Broadcast, I.instance, seq, root, {}};
  if (I.rank == root) {
    expect.payload.assign(p, p + bytes);
    auto rec = encodeValue(expect);
    dataFence(interruptCheck(I.mesh.get()), &rec, bytes, {}, I.timeout, "broadcast");
    return;
  }
  auto values =
      dataFence(interruptCheck(I.mesh.get()), nullptr, bytes, {root}, I.timeout, "broadcast");
  auto payload = decodeValue(values[0], expect, root);
  if (payload.size() != bytes) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("pmix bootstrap: broadcast from rank {} carried {} bytes, this rank "
                            "expected {}; every rank must pass the same size",
                            root, payload.size(), bytes),
                root);
  }
  if (bytes > 0) std::memcpy(p, payload.data(), bytes);
}

void PmixBootstrap::barrier() {
  auto& I = *impl_;
  std::optional<mesh::CallScope> call;
  if (I.mesh) call.emplace(I.mesh->interruptKey());
  I.checkNotAborted();
  std::lock_guard lk(I.callMu);
  ++I.seq;
  if (I.size == 1) return;
  Session& s = session();
  std::lock_guard fk(s.fenceMu);
  fence(false, I.timeout, "barrier", interruptCheck(I.mesh.get()));
}

}  // namespace strata::pmix
