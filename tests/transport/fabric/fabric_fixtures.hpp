#pragma once

// What the files of the fabric transport's test (test_fabric_transport.cpp and the files it
// names) share: the module under test, the two ranks' transports, two transports in this process
// (Pair), and a peer process that only sleeps while data lands in its memory (PeerProcess).

#include <boost/test/unit_test.hpp>

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <strata/backend/module.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>

#include "tests/harness/mp_test.hpp"
#include "tests/harness/transport_sdk.hpp"

using strata::Config;
using strata::Error;
using strata::ErrorCode;
using strata::MemoryKind;
using strata::testing::catchError;
using strata::testing::checkPattern;
using strata::testing::countOpenFds;
using strata::testing::fillPattern;
namespace backend = strata::backend;

/// The module under test (main() loads it) and this executable (re-run as the peer process).
extern const backend::ModuleInfo* g_info;
extern std::string g_self;

/// The module's entry point, or null with `error` set.
const backend::ModuleInfo* loadModule(const std::string& path, std::string& error);
/// The environment's config (the provider from STRATA_TRANSPORT_FABRIC_PROVIDER), with
/// transport.timeout = 20.
Config& config();
/// transport.fabric.provider: "tcp;ofi_rxm", "shm", ...
std::string provider();
/// Rank `rank` (0 or 1) of two ranks on this host.
std::unique_ptr<Transport> makeTransport(int rank);
/// Rank `rank` in process `pid` (this one when 0), as a peer on this host.
PeerInfo peerInfo(int rank, pid_t pid = 0);

/// Page-aligned host buffer.
struct Buffer {
  explicit Buffer(size_t n);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data;
  size_t size;
};

/// The peer process's main (this executable run with --peer RFD WFD BYTES): registers a buffer,
/// publishes endpoint and descriptor, then only sleeps: it blocks in read() on the command pipe
/// and checks its memory with sleeps in between. It never calls into the transport again, so
/// whatever lands does so through the transport's own progress thread.
int peerMain(int rfd, int wfd, size_t bytes);

/// A peer process of `bytes` registered bytes, rank 1; ended when this goes out of scope.
struct PeerProcess {
  explicit PeerProcess(size_t bytes);
  ~PeerProcess();
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;
  /// True once the peer sees the pattern of `seed` at [offset, offset + len) (it waits 20 s).
  bool verify(uint64_t seed, uint64_t offset, uint64_t len);
  void killNow();
  size_t bytes;
  pid_t pid = -1;
  int rfd = -1, wfd = -1;
  std::vector<uint8_t> endpoint, descriptor;
};

/// Rank 0 in this process connected to a peer process (rank 1) of `bytes` bytes: a source buffer
/// of as many bytes registered here, the peer's buffer imported.
struct PeerLink {
  explicit PeerLink(size_t bytes);
  LocalRef local() { return {src.data, src.size, MemoryKind::Host, mem.get()}; }
  RemoteRef dst() { return {peer.bytes, MemoryKind::Host, remote.get()}; }
  PeerProcess peer;
  std::unique_ptr<Transport> t;
  Buffer src;
  std::unique_ptr<backend::LocalMemory> mem;
  std::unique_ptr<backend::RemoteMemory> remote;
  std::unique_ptr<backend::TransportConnection> conn;
};

/// Two transports in this process, A writing into B.
struct Pair {
  Pair(size_t srcBytes, size_t dstBytes);
  LocalRef local() { return {src.data, src.size, MemoryKind::Host, srcMem.get()}; }
  RemoteRef remoteRef() { return {dst.size, MemoryKind::Host, remote.get()}; }
  Buffer src, dst;
  std::unique_ptr<Transport> a, b;
  std::unique_ptr<backend::LocalMemory> srcMem, dstMem;
  std::unique_ptr<backend::RemoteMemory> remote;
  std::unique_ptr<backend::TransportConnection> conn;
};
