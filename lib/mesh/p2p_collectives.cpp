#include "mesh/p2p_collectives.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include <strata/error.hpp>

namespace strata::p2p {

bool allGatherNeeded(int size, const void* data, size_t bytesPerRank) {
  if (size == 1 || bytesPerRank == 0) return false;
  if (!data) throw Error(ErrorCode::InvalidArgument, "allGather: null buffer");
  return true;
}

bool broadcastNeeded(int size, const void* data, size_t bytes, int root) {
  if (root < 0 || root >= size) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("broadcast: root {} is out of range 0..{}", root, size - 1), root);
  }
  if (bytes && !data) throw Error(ErrorCode::InvalidArgument, "broadcast: null buffer");
  return size > 1;
}

bool barrierNeeded(int size) {
  return size > 1;
}

void checkPeer(int rank, int size, int peer, std::string_view op) {
  if (peer < 0 || peer >= size) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{}: peer {} is out of range 0..{}", op, peer, size - 1), peer);
  }
  if (peer == rank) {
    throw Error(
        ErrorCode::InvalidArgument,
        fmt::format("{}: peer {} is this rank; send/recv to self is not supported", op, peer),
        peer);
  }
}

void allGather(const Messenger& m, AllGatherAlgorithm algorithm, void* data, size_t bytesPerRank) {
  const int n = m.size, r = m.rank;
  auto* out = static_cast<uint8_t*>(data);
  auto slot = [&](int q) { return out + static_cast<size_t>(q) * bytesPerRank; };
  const size_t total = static_cast<size_t>(n) * bytesPerRank;
  switch (algorithm) {
    case AllGatherAlgorithm::Star:
      if (r == 0) {
        for (int p = 1; p < n; ++p) m.recv(p, 0, slot(p), bytesPerRank);
        for (int p = 1; p < n; ++p) m.send(p, 1, out, total);
      } else {
        m.send(0, 0, slot(r), bytesPerRank);
        m.recv(0, 1, out, total);
      }
      return;
    case AllGatherAlgorithm::Ring: {
      const int next = (r + 1) % n, prev = (r - 1 + n) % n;
      for (int step = 0; step < n - 1; ++step) {
        m.send(next, static_cast<uint32_t>(step), slot((r - step + n) % n), bytesPerRank);
        m.recv(prev, static_cast<uint32_t>(step), slot((r - step - 1 + n) % n), bytesPerRank);
      }
      return;
    }
    case AllGatherAlgorithm::Bruck: {
      // tmp[i] holds the block of rank (r + i) % n.
      std::vector<uint8_t> tmp(total);
      std::memcpy(tmp.data(), slot(r), bytesPerRank);
      uint32_t round = 0;
      for (int dist = 1; dist < n; dist *= 2, ++round) {
        const size_t bytes = static_cast<size_t>(std::min(dist, n - dist)) * bytesPerRank;
        m.send((r - dist + n) % n, round, tmp.data(), bytes);
        m.recv((r + dist) % n, round, tmp.data() + static_cast<size_t>(dist) * bytesPerRank, bytes);
      }
      for (int i = 0; i < n; ++i) {
        std::memcpy(slot((r + i) % n), tmp.data() + static_cast<size_t>(i) * bytesPerRank,
                    bytesPerRank);
      }
      return;
    }
  }
}

void broadcast(const Messenger& m, bool star, void* data, size_t bytes, int root) {
  const int n = m.size, r = m.rank;
  if (star) {
    if (r == root) {
      for (int p = 0; p < n; ++p) {
        if (p != root) m.send(p, 0, data, bytes);
      }
    } else {
      m.recv(root, 0, data, bytes);
    }
    return;
  }
  // Virtual rank vr = distance from the root; a rank receives from the parent that clears its
  // lowest set bit, then sends to the children below that bit.
  const int vr = (r - root + n) % n;
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      m.recv((vr - mask + root) % n, 0, data, bytes);
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) m.send((vr + mask + root) % n, 0, data, bytes);
  }
}

void barrier(const Messenger& m, bool star) {
  const int n = m.size, r = m.rank;
  if (star) {
    if (r == 0) {
      for (int p = 1; p < n; ++p) m.recv(p, 0, nullptr, 0);
      for (int p = 1; p < n; ++p) m.send(p, 1, nullptr, 0);
    } else {
      m.send(0, 0, nullptr, 0);
      m.recv(0, 1, nullptr, 0);
    }
    return;
  }
  uint32_t round = 0;
  for (int dist = 1; dist < n; dist <<= 1, ++round) {
    m.send((r + dist) % n, round, nullptr, 0);
    m.recv((r - dist + n) % n, round, nullptr, 0);
  }
}

}  // namespace strata::p2p
