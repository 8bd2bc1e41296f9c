#include "peer_maps.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace strata::collectives {

namespace {

/// Opens pid's fd and maps `bytes` of it read-only, checking that it is the file of `inode`
/// and at least that long. nullptr with *why on failure.
char* mapPeerFile(int pid, int fd, uint64_t inode, size_t bytes, bool populate, std::string* why) {
  const std::string path = fmt::format("/proc/{}/fd/{}", pid, fd);
  int local = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (local < 0) {
    const int err = errno;
    *why = fmt::format("cannot open {}: {}", path, std::strerror(err));
    return nullptr;
  }
  struct stat st {};
  char* base = nullptr;
  if (fstat(local, &st) != 0) {
    *why = fmt::format("fstat {}: {}", path, std::strerror(errno));
  } else if (static_cast<uint64_t>(st.st_ino) != inode) {
    *why = fmt::format("{} is another file (inode {}, the descriptor says {})", path,
                       static_cast<uint64_t>(st.st_ino), inode);
  } else if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    *why = fmt::format("{} has {} bytes, the descriptor says {}", path,
                       static_cast<int64_t>(st.st_size), bytes);
  } else {
    void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED | (populate ? MAP_POPULATE : 0), local, 0);
    if (p == MAP_FAILED) {
      *why = fmt::format("mmap of {} ({} B): {}", path, bytes, std::strerror(errno));
    } else {
      base = static_cast<char*>(p);
    }
  }
  ::close(local);  // the mapping keeps the file
  return base;
}

}  // namespace

PeerMaps::PeerMaps(int size) : peers_(static_cast<size_t>(size)) {}

PeerMaps::~PeerMaps() {
  for (Peer& p : peers_) {
    for (Entry& e : p.entries) munmap(e.base, e.bytes);
  }
}

void PeerMaps::drop(Peer& peer, size_t i) {
  munmap(peer.entries[i].base, peer.entries[i].bytes);
  peer.entries.erase(peer.entries.begin() + static_cast<std::ptrdiff_t>(i));
}

const char* PeerMaps::map(int peer, int pid, const backend::SharedHostRegion& region,
                          uint64_t frees, std::string* why) {
  Peer& p = peers_.at(static_cast<size_t>(peer));
  if (frees != p.frees) {
    // The peer freed something since: keep only the allocation asked for.
    for (size_t i = p.entries.size(); i-- > 0;) {
      if (p.entries[i].id != region.id) drop(p, i);
    }
    p.frees = frees;
  }
  for (Entry& e : p.entries) {
    if (e.id == region.id) {
      if (e.bytes != region.bytes) break;  // same id, another length: not to be trusted
      e.lastUse = ++tick_;
      return e.base;
    }
  }
  for (size_t i = 0; i < p.entries.size(); ++i) {
    if (p.entries[i].id == region.id) {
      drop(p, i);
      break;
    }
  }
  char* base = mapPeerFile(pid, region.fd, region.inode, region.bytes, true, why);
  if (!base) return nullptr;
  if (p.entries.size() >= kMaxPerPeer) {
    size_t oldest = 0;
    for (size_t i = 1; i < p.entries.size(); ++i) {
      if (p.entries[i].lastUse < p.entries[oldest].lastUse) oldest = i;
    }
    drop(p, oldest);
  }
  p.entries.push_back({region.id, base, region.bytes, ++tick_});
  return base;
}

std::string PeerMaps::probe(int pid, int fd, uint64_t inode, uint64_t word) {
  std::string why;
  const size_t bytes = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  char* base = mapPeerFile(pid, fd, inode, bytes, false, &why);
  if (!base) return why;
  uint64_t seen = 0;
  std::memcpy(&seen, base, sizeof seen);
  munmap(base, bytes);
  return seen == word ? std::string() : std::string("read a different value (not the probe word)");
}

}  // namespace strata::collectives
