// The nvlink transport on a real GPU, through the plugin SDK only (the core is not used):
// the module is dlopen()ed like the core would, and a second process is started (posix_spawn
// of this binary with --child) to import buffers through CUDA IPC, because a forked child of a
// process that initialised CUDA cannot use CUDA. Without a GPU the program exits 77 before
// Boost.Test runs. `--bench` prints write bandwidths and signal latencies instead (not a test).

#define BOOST_TEST_MODULE nvlink_gpu
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>
#include <boost/test/unit_test_monitor.hpp>

#include <cuda_runtime_api.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <strata/backend/module.hpp>
#include <strata/error.hpp>

#include "backends/transport/nvlink/nvlink_records.hpp"
#include "base/dynload.hpp"
#include "tests/harness/transport_sdk.hpp"

extern char** environ;

namespace {

using namespace strata;

constexpr uint64_t kHostId = 0x5157;  // any value both processes agree on
std::string gModulePath;
std::string gSelf;  // this executable

#define CUDA_OK(call)                                                               \
  do {                                                                              \
    cudaError_t e_ = (call);                                                        \
    if (e_ != cudaSuccess) {                                                        \
      throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorString(e_)); \
    }                                                                               \
  } while (0)

const backend::ModuleInfo& moduleInfo() {
  static const backend::ModuleInfo* info = [] {
    auto lib = DynamicLibrary::open(gModulePath);
    auto fn = reinterpret_cast<strata_module_info_fn>(lib.symbol(STRATA_MODULE_ENTRY_POINT));
    if (!fn) throw std::runtime_error(gModulePath + " has no " STRATA_MODULE_ENTRY_POINT);
    return fn();
  }();
  return *info;
}

std::unique_ptr<Transport> makeTransport(int rank) {
  return moduleInfo().createTransport(testing::pairInit(rank, kHostId));
}

PeerInfo peerInfo(int rank, pid_t pid) {
  return testing::sameHostPeer(rank, pid, kHostId);
}

uint8_t pattern(size_t i, uint32_t seed) {
  return static_cast<uint8_t>((i * 131 + seed) >> 1);
}

void fillPattern(std::vector<uint8_t>& v, uint32_t seed) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = pattern(i, seed);
}

std::string hex(const std::vector<uint8_t>& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (uint8_t c : b) {
    s += d[c >> 4];
    s += d[c & 15];
  }
  return s;
}

std::vector<uint8_t> unhex(std::string_view s) {
  std::vector<uint8_t> b;
  auto v = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i + 1 < s.size(); i += 2) b.push_back(v(s[i]) << 4 | v(s[i + 1]));
  return b;
}

/// Polls a device counter until it reaches want, or throws after the deadline.
void waitSignal(Transport& t, const LocalRef& mem, uint64_t offset, uint64_t want,
                double seconds = 30) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (t.loadSignal(mem, offset) < want) {
    if (std::chrono::steady_clock::now() > end) {
      throw std::runtime_error("signal " + std::to_string(want) + " did not arrive");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

/// posix_spawn()s this binary with args; returns its pid.
pid_t spawnChild(const std::vector<std::string>& args) {
  std::vector<std::string> all = {gSelf, "--nvlink-module=" + gModulePath, "--child"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, gSelf.c_str(), nullptr, nullptr, argv.data(), environ);
  if (rc != 0) throw std::runtime_error(std::string("posix_spawn: ") + std::strerror(rc));
  return pid;
}

/// Waits for the child with a deadline (kills it by pid on timeout); returns its exit status.
int waitChild(pid_t pid, double seconds = 60) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::steady_clock::now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

struct DeviceBuffer {
  Transport& t;
  void* p;
  size_t n;
  DeviceBuffer(Transport& tr, size_t bytes)
      : t(tr), p(tr.allocate(bytes, MemoryKind::Cuda)), n(bytes) {}
  ~DeviceBuffer() { t.deallocate(p, MemoryKind::Cuda); }
  char* c() const { return static_cast<char*>(p); }
  LocalRef ref(backend::LocalMemory* m = nullptr) const { return {p, n, MemoryKind::Cuda, m}; }
};

/// cudaMemset and pageable cudaMemcpy H2D may return before the device has the data, and the
/// transport's non-blocking streams do not order after the legacy default stream: the tests'
/// own set-up copies must have landed before a transport copy reads or overwrites the buffer.
void settle() {
  CUDA_OK(cudaDeviceSynchronize());
}

void checkStatsZero(const Transport& t) {
  auto s = t.stats();
  BOOST_TEST(s.registrations == 0u);
  BOOST_TEST(s.imports == 0u);
  BOOST_TEST(s.connections == 0u);
}

// ---------------------------------------------------------------------------------------------
// Child roles. Exit 0 on success; anything else prints why to stderr.

// import <data desc> <flag desc> <bytes> <seed-in> <seed-out>: checks the owner's pattern,
// writes another one back, then raises the flag to 1 with updateAndSync.
int childImport(char** argv) {
  auto t = makeTransport(1);
  auto owner = peerInfo(0, getppid());
  auto dataDesc = unhex(argv[0]);
  auto flagDesc = unhex(argv[1]);
  size_t bytes = std::stoull(argv[2]);
  uint32_t seedIn = std::stoul(argv[3]), seedOut = std::stoul(argv[4]);
  auto data = t->importMemory(owner, dataDesc, bytes, MemoryKind::Cuda);
  // A second import of the same handle in one process (reference-counted by CUDA); closing it
  // must leave the first mapping usable.
  { auto again = t->importMemory(owner, dataDesc, bytes, MemoryKind::Cuda); }
  auto flag = t->importMemory(owner, flagDesc, 8, MemoryKind::Cuda);
  std::vector<uint8_t> got(bytes), want(bytes);
  fillPattern(want, seedIn);
  CUDA_OK(cudaMemcpy(got.data(), data->devicePointer(), bytes, cudaMemcpyDeviceToHost));
  if (got != want) {
    std::fprintf(stderr, "child: the owner's pattern differs through the IPC mapping\n");
    return 2;
  }
  DeviceBuffer src(*t, bytes);
  fillPattern(want, seedOut);
  CUDA_OK(cudaMemcpy(src.p, want.data(), bytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize());  // see settle()
  nvlink::Endpoint ep;
  ep.pid = getppid();
  ep.hostId = kHostId;
  auto conn = t->connect(owner, nvlink::encodeEndpoint(ep));
  RemoteRef dst{bytes, MemoryKind::Cuda, data.get()};
  conn->write(dst, 0, src.ref(), 0, bytes);
  conn->updateAndSync(RemoteRef{8, MemoryKind::Cuda, flag.get()}, 0, 1);
  conn->flush(30);
  conn.reset();
  data.reset();
  flag.reset();
  auto s = t->stats();
  if (s.registrations || s.imports || s.connections) {
    std::fprintf(stderr, "child: stats not back to zero\n");
    return 3;
  }
  return 0;
}

// sleep: exits after a short while (a peer for checkPeer()).
int childSleep() {
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  return 0;
}

// bench <data desc> <flag desc> <bytes>: writes to the owner's buffer at several sizes and
// prints the bandwidth; then times updateAndSync + flush.
int childBench(char** argv) {
  auto t = makeTransport(1);
  auto owner = peerInfo(0, getppid());
  size_t bytes = std::stoull(argv[2]);
  auto data = t->importMemory(owner, unhex(argv[0]), bytes, MemoryKind::Cuda);
  auto flag = t->importMemory(owner, unhex(argv[1]), 8, MemoryKind::Cuda);
  DeviceBuffer src(*t, bytes);
  nvlink::Endpoint ep;
  ep.pid = getppid();
  ep.hostId = kHostId;
  auto conn = t->connect(owner, nvlink::encodeEndpoint(ep));
  RemoteRef dst{bytes, MemoryKind::Cuda, data.get()};
  std::printf("# cross-process write (child -> parent's cudaMalloc buffer via CUDA IPC)\n");
  std::printf("%12s %8s %12s %10s\n", "bytes", "iters", "us/write", "GB/s");
  for (size_t n = 4096; n <= bytes; n *= 4) {
    int iters = n <= (1 << 20) ? 200 : 20;
    conn->write(dst, 0, src.ref(), 0, n);  // warm-up
    conn->flush(30);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) conn->write(dst, 0, src.ref(), 0, n);
    conn->flush(30);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%12zu %8d %12.2f %10.2f\n", n, iters, s / iters * 1e6, n * iters / s / 1e9);
  }
  const int rounds = 1000;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 1; i <= rounds; ++i) {
    conn->updateAndSync(RemoteRef{8, MemoryKind::Cuda, flag.get()}, 0, i);
    conn->flush(30);
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("# updateAndSync + flush: %.2f us per round (%d rounds)\n", s / rounds * 1e6, rounds);
  return 0;
}

int childMain(int argc, char** argv) {
  try {
    std::string role = argc > 0 ? argv[0] : "";
    if (role == "import" && argc == 6) return childImport(argv + 1);
    if (role == "sleep") return childSleep();
    if (role == "bench" && argc == 4) return childBench(argv + 1);
    std::fprintf(stderr, "child: bad arguments\n");
    return 10;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child: %s\n", e.what());
    return 11;
  }
}

int benchMain() {
  auto t = makeTransport(0);
  const size_t bytes = 256u << 20;
  DeviceBuffer data(*t, bytes), flag(*t, 8);
  auto dataReg = t->registerMemory(data.p, bytes, MemoryKind::Cuda, nullptr);
  auto flagReg = t->registerMemory(flag.p, 8, MemoryKind::Cuda, nullptr);
  // Same-process write first (the copy engine's device-local rate).
  auto self = peerInfo(0, getpid());
  auto local = t->importMemory(self, dataReg->descriptor(), bytes, MemoryKind::Cuda);
  auto conn = t->connect(self, t->endpoint());
  DeviceBuffer src(*t, bytes);
  RemoteRef dst{bytes, MemoryKind::Cuda, local.get()};
  std::printf("# same-process write (D2D on one GPU)\n%12s %12s %10s\n", "bytes", "us/write",
              "GB/s");
  for (size_t n = 4096; n <= bytes; n *= 4) {
    int iters = n <= (1 << 20) ? 200 : 20;
    conn->write(dst, 0, src.ref(), 0, n);
    conn->flush(30);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) conn->write(dst, 0, src.ref(), 0, n);
    conn->flush(30);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%12zu %12.2f %10.2f\n", n, s / iters * 1e6, n * iters / s / 1e9);
  }
  const int reads = 1000;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reads; ++i) (void)t->loadSignal(flag.ref(), 0);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("# loadSignal (8-byte D2H copy): %.2f us per call\n", s / reads * 1e6);
  std::fflush(stdout);
  pid_t pid = spawnChild(
      {"bench", hex(dataReg->descriptor()), hex(flagReg->descriptor()), std::to_string(bytes)});
  int rc = waitChild(pid, 300);
  std::printf("# child exit status %d\n", rc);
  return rc == 0 ? 0 : 1;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(module_info) {
  const auto& info = moduleInfo();
  BOOST_TEST(info.abiVersion == STRATA_MODULE_ABI_VERSION);
  BOOST_TEST(static_cast<int>(info.kind) == static_cast<int>(backend::ModuleKind::Transport));
  BOOST_TEST(std::string(info.name) == "nvlink");
  BOOST_TEST(info.createBootstrap == nullptr);
  BOOST_TEST(info.createTransport != nullptr);
  auto t = makeTransport(0);
  BOOST_TEST(t->name() == "nvlink");
  BOOST_TEST(t->supportsMemory(MemoryKind::Cuda));
  BOOST_TEST(!t->supportsMemory(MemoryKind::Host));
  BOOST_TEST(t->canReach(peerInfo(1, 1)));
  PeerInfo remote = peerInfo(1, 1);
  remote.sameHost = false;
  BOOST_TEST(!t->canReach(remote));
  BOOST_TEST(static_cast<int>(t->signalMemoryKind()) == static_cast<int>(MemoryKind::Cuda));
  BOOST_TEST(t->allocate(64, MemoryKind::Host) == nullptr);
  auto ep = nvlink::decodeEndpoint(t->endpoint());
  BOOST_TEST(ep.pid == getpid());
  BOOST_TEST(ep.hostId == kHostId);
  BOOST_TEST(!ep.pciBusId.empty());
  BOOST_TEST_MESSAGE("device " << nvlink::uuidString(ep.deviceUuid) << " at " << ep.pciBusId);
}

BOOST_AUTO_TEST_CASE(register_and_import_in_process) {
  auto t = makeTransport(0);
  {
    DeviceBuffer buf(*t, 1 << 20);
    auto reg = t->registerMemory(buf.c() + 4096, 65536, MemoryKind::Cuda, nullptr);
    BOOST_TEST(t->stats().registrations == 1u);
    auto d = nvlink::decodeDescriptor(reg->descriptor());
    BOOST_TEST(d.pid == getpid());
    BOOST_TEST(d.offset == 4096u);
    BOOST_TEST(d.length == 65536u);
    BOOST_TEST(d.allocationBase == reinterpret_cast<uint64_t>(buf.p));
    BOOST_TEST(d.allocationSize >= (1u << 20));
    BOOST_TEST(d.ownerAddress == reinterpret_cast<uint64_t>(buf.c() + 4096));
    BOOST_TEST(d.find(nvlink::HandleType::RuntimeIpc) != nullptr);
    BOOST_TEST(d.deviceUuid != nvlink::Uuid{});
    auto self = peerInfo(0, getpid());
    auto imp = t->importMemory(self, reg->descriptor(), 65536, MemoryKind::Cuda);
    BOOST_TEST(imp->devicePointer() == static_cast<void*>(buf.c() + 4096));
    BOOST_TEST(t->stats().imports == 1u);

    // Wrong owner pid, truncated record, wrong kind, too many bytes: all refused.
    auto check = [&](auto fn, ErrorCode code) {
      try {
        fn();
        BOOST_ERROR("no error");
      } catch (const Error& e) {
        BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(code), e.what());
        BOOST_TEST_MESSAGE(e.what());
      }
    };
    auto desc = reg->descriptor();
    check([&] { t->importMemory(peerInfo(0, getpid() + 1), desc, 8, MemoryKind::Cuda); },
          ErrorCode::ProtocolError);
    auto cut = desc;
    cut.resize(cut.size() - 3);
    check([&] { t->importMemory(self, cut, 8, MemoryKind::Cuda); }, ErrorCode::ProtocolError);
    check([&] { t->importMemory(self, desc, 65537, MemoryKind::Cuda); }, ErrorCode::ProtocolError);
    check([&] { t->importMemory(self, desc, 8, MemoryKind::Host); }, ErrorCode::NotSupported);
    std::vector<char> host(64);
    check([&] { t->registerMemory(host.data(), 64, MemoryKind::Host, nullptr); },
          ErrorCode::NotSupported);
    check([&] { t->registerMemory(host.data(), 64, MemoryKind::Cuda, nullptr); },
          ErrorCode::InvalidArgument);
    check([&] { t->registerMemory(buf.c() + 4096, 1 << 20, MemoryKind::Cuda, nullptr); },
          ErrorCode::InvalidArgument);
  }
  checkStatsZero(*t);
}

BOOST_AUTO_TEST_CASE(writes_of_several_sizes) {
  auto t = makeTransport(0);
  {
    const size_t cap = (16u << 20) + 64;
    DeviceBuffer dstBuf(*t, cap), srcBuf(*t, cap);
    auto reg = t->registerMemory(dstBuf.p, cap, MemoryKind::Cuda, nullptr);
    auto self = peerInfo(0, getpid());
    auto remote = t->importMemory(self, reg->descriptor(), cap, MemoryKind::Cuda);
    auto conn = t->connect(self, t->endpoint());
    RemoteRef dst{cap, MemoryKind::Cuda, remote.get()};
    void* pinned = nullptr;
    CUDA_OK(cudaMallocHost(&pinned, cap));
    uint32_t seed = 1;
    for (size_t n :
         {size_t{1}, size_t{7}, size_t{4096}, size_t{65539}, size_t{1} << 20, size_t{16} << 20}) {
      for (int source = 0; source < 3; ++source) {  // device, pageable host, pinned host
        ++seed;
        const uint64_t srcOff = n % 5, dstOff = (n * 3) % 61;
        std::vector<uint8_t> want(n);
        fillPattern(want, seed);
        CUDA_OK(cudaMemset(dstBuf.p, 0, cap));
        LocalRef src;
        std::vector<uint8_t> pageable;
        if (source == 0) {
          CUDA_OK(cudaMemcpy(srcBuf.c() + srcOff, want.data(), n, cudaMemcpyHostToDevice));
          src = srcBuf.ref();
        } else if (source == 1) {
          pageable.resize(n + srcOff);
          std::memcpy(pageable.data() + srcOff, want.data(), n);
          src = {pageable.data(), pageable.size(), MemoryKind::Host, nullptr};
        } else {
          std::memcpy(static_cast<char*>(pinned) + srcOff, want.data(), n);
          src = {pinned, cap, MemoryKind::Host, nullptr};
        }
        settle();
        conn->write(dst, dstOff, src, srcOff, n);
        conn->flush(30);
        std::vector<uint8_t> got(n + dstOff + 8);
        CUDA_OK(cudaMemcpy(got.data(), dstBuf.p, got.size(), cudaMemcpyDeviceToHost));
        BOOST_TEST((std::equal(want.begin(), want.end(), got.begin() + dstOff)),
                   "size " << n << " source " << source);
        // Nothing written around the range.
        bool clean = true;
        for (size_t i = 0; i < dstOff; ++i) clean &= got[i] == 0;
        for (size_t i = dstOff + n; i < got.size(); ++i) clean &= got[i] == 0;
        BOOST_TEST(clean, "size " << n << " source " << source << " wrote outside its range");
      }
    }
    CUDA_OK(cudaFreeHost(pinned));
  }
  checkStatsZero(*t);
}

BOOST_AUTO_TEST_CASE(update_and_sync_after_data) {
  auto t = makeTransport(0);
  {
    const size_t n = 64u << 20;
    DeviceBuffer dstBuf(*t, n), srcBuf(*t, n), flagBuf(*t, 64);
    CUDA_OK(cudaMemset(flagBuf.p, 0, 64));
    settle();
    auto regData = t->registerMemory(dstBuf.p, n, MemoryKind::Cuda, nullptr);
    auto regFlag = t->registerMemory(flagBuf.p, 64, MemoryKind::Cuda, nullptr);
    auto self = peerInfo(0, getpid());
    auto data = t->importMemory(self, regData->descriptor(), n, MemoryKind::Cuda);
    auto flag = t->importMemory(self, regFlag->descriptor(), 64, MemoryKind::Cuda);
    auto conn = t->connect(self, t->endpoint());
    RemoteRef dst{n, MemoryKind::Cuda, data.get()};
    RemoteRef flagRef{64, MemoryKind::Cuda, flag.get()};
    std::vector<uint8_t> want(n), got(n);
    // A large write then the signal, without flush: once the signal is seen the data must be
    // complete. Several rounds with a different pattern each.
    for (uint32_t round = 1; round <= 4; ++round) {
      fillPattern(want, round * 977);
      CUDA_OK(cudaMemcpy(srcBuf.p, want.data(), n, cudaMemcpyHostToDevice));
      settle();
      conn->write(dst, 0, srcBuf.ref(), 0, n);
      conn->updateAndSync(flagRef, 8, round);
      waitSignal(*t, flagBuf.ref(), 8, round);
      CUDA_OK(cudaMemcpy(got.data(), dstBuf.p, n, cudaMemcpyDeviceToHost));
      BOOST_TEST((got == want), "round " << round);
    }
    // More signals than the connection has pinned slots: the last value wins, none is lost.
    for (uint64_t v = 100; v < 400; ++v) conn->updateAndSync(flagRef, 16, v);
    conn->flush(30);
    BOOST_TEST(t->loadSignal(flagBuf.ref(), 16) == 399u);
    BOOST_TEST(t->loadSignal(flagBuf.ref(), 8) == 4u);
  }
  checkStatsZero(*t);
}

BOOST_AUTO_TEST_CASE(import_in_another_process) {
  auto t = makeTransport(0);
  {
    const size_t n = (4u << 20) + 13;
    DeviceBuffer buf(*t, n + 256), flagBuf(*t, 8);
    CUDA_OK(cudaMemset(flagBuf.p, 0, 8));
    std::vector<uint8_t> pat(n);
    fillPattern(pat, 11);
    // Register at an offset inside the allocation so that the offset path is exercised.
    CUDA_OK(cudaMemcpy(buf.c() + 256, pat.data(), n, cudaMemcpyHostToDevice));
    auto regData = t->registerMemory(buf.c() + 256, n, MemoryKind::Cuda, nullptr);
    auto regFlag = t->registerMemory(flagBuf.p, 8, MemoryKind::Cuda, nullptr);
    settle();
    pid_t pid = spawnChild({"import", hex(regData->descriptor()), hex(regFlag->descriptor()),
                            std::to_string(n), "11", "23"});
    waitSignal(*t, flagBuf.ref(), 0, 1, 60);
    std::vector<uint8_t> got(n);
    fillPattern(pat, 23);
    CUDA_OK(cudaMemcpy(got.data(), buf.c() + 256, n, cudaMemcpyDeviceToHost));
    BOOST_TEST((got == pat));
    // The child unmaps before it exits; only then may the owner free (teardown order).
    BOOST_TEST(waitChild(pid) == 0);
  }
  checkStatsZero(*t);
}

BOOST_AUTO_TEST_CASE(peer_exit_is_peer_lost) {
  auto t = makeTransport(0);
  {
    pid_t pid = spawnChild({"sleep"});
    nvlink::Endpoint ep;
    ep.pid = pid;
    ep.hostId = kHostId;
    auto conn = t->connect(peerInfo(1, pid), nvlink::encodeEndpoint(ep));
    conn->checkPeer();  // alive
    // The pidfd turns readable at exit, before the parent reaps the child.
    for (int i = 0; i < 2000; ++i) {
      try {
        conn->checkPeer();
      } catch (const Error& e) {
        BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::PeerLost));
        BOOST_TEST(e.peer() == 1);
        BOOST_TEST_MESSAGE(e.what());
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    BOOST_CHECK_THROW(conn->checkPeer(), Error);
    BOOST_TEST(waitChild(pid) == 0);
  }
  checkStatsZero(*t);
}

BOOST_AUTO_TEST_CASE(flush_with_nothing_pending_and_zero_bytes) {
  auto t = makeTransport(0);
  {
    DeviceBuffer buf(*t, 64);
    auto reg = t->registerMemory(buf.p, 64, MemoryKind::Cuda, nullptr);
    auto self = peerInfo(0, getpid());
    auto imp = t->importMemory(self, reg->descriptor(), 64, MemoryKind::Cuda);
    auto conn = t->connect(self, t->endpoint());
    conn->flush(1);
    conn->write(RemoteRef{64, MemoryKind::Cuda, imp.get()}, 0, buf.ref(), 0, 0);
    conn->flush(0);
  }
  checkStatsZero(*t);
}

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a.starts_with("--nvlink-module=")) {
      gModulePath = std::string(a.substr(16));
    } else {
      args.push_back(argv[i]);
    }
  }
  gSelf = std::filesystem::read_symlink("/proc/self/exe");
  if (gModulePath.empty()) {
    // The core's search path (tests set it to the build tree).
    const char* path = std::getenv("STRATA_MODULE_PATH");
    std::string_view rest = path ? path : "";
    while (!rest.empty() && gModulePath.empty()) {
      auto colon = rest.find(':');
      auto dir = rest.substr(0, colon);
      auto file = std::filesystem::path(dir) / "strata-transport-nvlink.so";
      if (!dir.empty() && std::filesystem::exists(file)) gModulePath = file;
      rest = colon == std::string_view::npos ? "" : rest.substr(colon + 1);
    }
  }
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("no CUDA device: %s; skipping the nvlink GPU tests\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount says 0");
    return 77;
  }
  if (gModulePath.empty()) {
    std::printf(
        "strata-transport-nvlink.so not found (pass --nvlink-module=PATH or set "
        "STRATA_MODULE_PATH)\n");
    return 1;
  }
  if (args.size() > 1 && std::string_view(args[1]) == "--child") {
    return childMain(static_cast<int>(args.size()) - 2, args.data() + 2);
  }
  if (args.size() > 1 && std::string_view(args[1]) == "--bench") {
    try {
      return benchMain();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench: %s\n", e.what());
      return 1;
    }
  }
  boost::unit_test::unit_test_monitor.register_exception_translator<Error>([](const Error& e) {
    BOOST_ERROR("uncaught strata::Error (" << toString(e.code()) << ", peer " << e.peer()
                                           << "): " << e.what());
  });
  args.push_back(nullptr);
  return boost::unit_test::unit_test_main(&init_unit_test, static_cast<int>(args.size()) - 1,
                                          args.data());
}
