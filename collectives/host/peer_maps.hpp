#pragma once

// Same-host peers' allocHost memory (<strata/backend/host_memory.hpp>) mapped into this process,
// for the zero-copy path of the single-copy algorithms: a reader maps a peer's allocation once
// (opening the memfd through /proc/<pid>/fd) and then reads the peer's buffers with plain loads.
//
// A mapping is found by the allocation's id, never by address, so an address the peer's
// allocator reuses can never hit a stale mapping; the inode check guards the fd number. When a
// peer's free count changes, its other mappings are dropped (they may be of freed allocations,
// whose pages they would otherwise keep alive); at most kMaxPerPeer stay mapped per peer.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <strata/backend/host_memory.hpp>

namespace strata::collectives {

/// A peer's buffer as its single-copy descriptor names it: the address in the peer's process
/// and, for allocHost memory (region.id != 0), where it lies in the peer's allocation.
struct PeerBuffer {
  uint64_t address = 0;
  backend::SharedHostRegion region;
  bool shared() const { return region.id != 0; }
};

class PeerMaps {
 public:
  static constexpr size_t kMaxPerPeer = 32;

  explicit PeerMaps(int size = 0);
  ~PeerMaps();
  PeerMaps(const PeerMaps&) = delete;
  PeerMaps& operator=(const PeerMaps&) = delete;

  /// The start of peer's allocation `region` mapped read-only here, or nullptr with *why set
  /// (the fd is gone or names another file, /proc access denied, the mapping failed). frees is
  /// the peer's free count as its descriptor reported it.
  const char* map(int peer, int pid, const backend::SharedHostRegion& region, uint64_t frees,
                  std::string* why);
  /// Mappings held for peer (tests).
  size_t mapped(int peer) const { return peers_[static_cast<size_t>(peer)].entries.size(); }

  /// Whether this process can map pid's memfd fd (of that inode) and read `word` at its start:
  /// empty when it can, else why not. Unmaps again.
  static std::string probe(int pid, int fd, uint64_t inode, uint64_t word);

 private:
  struct Entry {
    uint64_t id = 0;
    char* base = nullptr;
    size_t bytes = 0;
    uint64_t lastUse = 0;
  };
  struct Peer {
    std::vector<Entry> entries;
    uint64_t frees = 0;
  };
  void drop(Peer& peer, size_t i);

  std::vector<Peer> peers_;
  uint64_t tick_ = 0;
};

}  // namespace strata::collectives
