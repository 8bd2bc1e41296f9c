#pragma once

// What the files of the shm transport's test (test_shm_transport.cpp and the files it names)
// share: the two ranks' transports, memfd buffers as the core allocates them, forked children
// that report through their exit status, pipes between parent and child, leak counters.

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <strata/error.hpp>

#include "backends/transport/shm/shm_transport.hpp"
#include "tests/harness/pattern.hpp"
#include "tests/harness/transport_sdk.hpp"

using strata::Error;
using strata::ErrorCode;
using strata::MemoryKind;
using strata::backend::HostAllocation;
using strata::backend::RemoteMemory;
using strata::backend::TransportConnection;
using strata::backend::TransportStats;
using strata::shm::decodeDescriptor;
using strata::shm::DescriptorMode;
using strata::shm::encodeDescriptor;
using strata::shm::MemoryDescriptor;
using strata::testing::checkPattern;
using strata::testing::fillPattern;
using strata::testing::patternByte;
using Clock = std::chrono::steady_clock;

inline constexpr uint64_t kHostId = 0x5eed5eedull;
inline constexpr size_t kMiB = size_t{1} << 20;

/// Rank `rank` (0 or 1) of two ranks on this host.
std::unique_ptr<Transport> makeTransport(int rank);
/// Rank `rank` in process `pid`, as a peer.
PeerInfo peerOf(int rank, pid_t pid);

// Host memory as the core allocates it: a memfd, mapped, the buffer at `offset` inside it.
struct MemfdBuffer {
  int fd = -1;
  uint64_t inode = 0;
  char* base = nullptr;
  size_t mapped = 0;
  size_t offset = 0;
  size_t size = 0;

  MemfdBuffer(size_t bytes, size_t off) : offset(off), size(bytes) {
    fd = memfd_create("strata-shm-test", MFD_CLOEXEC);
    if (fd < 0) throw std::runtime_error(std::string("memfd_create: ") + std::strerror(errno));
    mapped = offset + bytes;
    if (ftruncate(fd, static_cast<off_t>(mapped)) != 0) throw std::runtime_error("ftruncate");
    struct stat st {};
    fstat(fd, &st);
    inode = st.st_ino;
    void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap");
    base = static_cast<char*>(p);
  }
  ~MemfdBuffer() {
    munmap(base, mapped);
    close(fd);
  }
  MemfdBuffer(const MemfdBuffer&) = delete;
  MemfdBuffer& operator=(const MemfdBuffer&) = delete;
  char* data() const { return base + offset; }
  HostAllocation alloc() const { return HostAllocation{fd, inode, offset}; }
};

/// Runs fn in a forked child; its exit status is 0 on success, 1 on a failed check or an
/// exception (printed), 3 for NotSupported.
pid_t runChild(const std::function<void()>& fn);
/// The child's exit status, or -1 if it died of a signal; kills it after timeoutSeconds.
int waitChild(pid_t pid, double timeoutSeconds = 120);
/// Throws (failing the child that calls it) unless ok.
void check(bool ok, const std::string& what);
/// Expects fn to throw strata::Error with that code (and peer, if >= -1 given as expectedPeer).
void expectError(ErrorCode code, const std::function<void()>& fn, const std::string& what,
                 int expectedPeer = -2);

/// Pipes for small messages between parent and child, read with a deadline.
struct Pipe {
  int fds[2] = {-1, -1};
  Pipe();
  ~Pipe();
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  void send(const std::vector<uint8_t>& data) const;
  std::vector<uint8_t> receive(double timeoutSeconds = 60) const;
};

size_t countOpenFds();
/// True under Yama ptrace_scope >= 1, where a child may not write into its parent.
bool ptraceRestricted();
bool isZero(const TransportStats& s);
