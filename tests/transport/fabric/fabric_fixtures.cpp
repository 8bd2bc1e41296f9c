#include "tests/transport/fabric/fabric_fixtures.hpp"

#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <thread>

using namespace std::chrono_literals;

const backend::ModuleInfo* g_info = nullptr;
std::string g_self;

const backend::ModuleInfo* loadModule(const std::string& path, std::string& error) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    error = dlerror();
    return nullptr;
  }
  auto fn = reinterpret_cast<strata_module_info_fn>(dlsym(lib, STRATA_MODULE_ENTRY_POINT));
  if (!fn) {
    error = "no strata_module_info";
    return nullptr;
  }
  return fn();
}

Config& config() {
  static Config c = [] {
    Config cfg = Config::load();
    cfg.set("transport.timeout", "20");
    return cfg;
  }();
  return c;
}

std::string provider() {
  return config().get("transport.fabric.provider").value_or("auto");
}

std::unique_ptr<Transport> makeTransport(int rank) {
  return g_info->createTransport(strata::testing::pairInit(rank, 0, &config()));
}

PeerInfo peerInfo(int rank, pid_t pid) {
  return strata::testing::sameHostPeer(rank, pid ? pid : getpid());
}

Buffer::Buffer(size_t n) : size(n) {
  data = static_cast<uint8_t*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096));
  BOOST_REQUIRE(data);
}

Buffer::~Buffer() {
  std::free(data);
}

namespace {

// ---- pipes between this process and a peer process ----

void writeAll(int fd, const void* p, size_t n) {
  auto* c = static_cast<const char*>(p);
  while (n) {
    ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw std::runtime_error("pipe write failed");
    c += w;
    n -= static_cast<size_t>(w);
  }
}
void readAll(int fd, void* p, size_t n, std::chrono::seconds timeout = 60s) {
  auto* c = static_cast<char*>(p);
  auto end = std::chrono::steady_clock::now() + timeout;
  while (n) {
    pollfd pfd{fd, POLLIN, 0};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0) throw std::runtime_error("pipe read timed out");
    if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    ssize_t r = ::read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw std::runtime_error("pipe closed");
    c += r;
    n -= static_cast<size_t>(r);
  }
}
void sendBlob(int fd, const std::vector<uint8_t>& b) {
  uint32_t n = static_cast<uint32_t>(b.size());
  writeAll(fd, &n, 4);
  writeAll(fd, b.data(), b.size());
}
std::vector<uint8_t> recvBlob(int fd) {
  uint32_t n = 0;
  readAll(fd, &n, 4);
  std::vector<uint8_t> b(n);
  readAll(fd, b.data(), n);
  return b;
}

}  // namespace

int peerMain(int rfd, int wfd, size_t bytes) {
  try {
    auto t = makeTransport(1);
    Buffer buf(bytes);
    std::memset(buf.data, 0, bytes);
    auto mem = t->registerMemory(buf.data, bytes, MemoryKind::Host, nullptr);
    sendBlob(wfd, t->endpoint());
    sendBlob(wfd, mem->descriptor());
    for (;;) {
      auto cmd = recvBlob(rfd);  // blocks: this thread sleeps
      if (cmd.size() != 24) return 0;
      uint64_t seed, offset, len;
      std::memcpy(&seed, cmd.data(), 8);
      std::memcpy(&offset, cmd.data() + 8, 8);
      std::memcpy(&len, cmd.data() + 16, 8);
      bool ok = false;
      auto end = std::chrono::steady_clock::now() + 20s;
      while (!(ok = checkPattern(buf.data + offset, len, seed) == len) &&
             std::chrono::steady_clock::now() < end) {
        std::this_thread::sleep_for(2ms);
      }
      sendBlob(wfd, {static_cast<uint8_t>(ok ? 1 : 0)});
    }
  } catch (const std::exception& e) {
    std::cerr << "fabric test peer: " << e.what() << std::endl;
    return 1;
  }
}

PeerProcess::PeerProcess(size_t bytes) : bytes(bytes) {
  int toPeer[2], fromPeer[2];
  BOOST_REQUIRE(pipe(toPeer) == 0 && pipe(fromPeer) == 0);
  pid = fork();
  BOOST_REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(toPeer[1]);
    ::close(fromPeer[0]);
    std::string r = std::to_string(toPeer[0]), w = std::to_string(fromPeer[1]),
                b = std::to_string(bytes);
    execl(g_self.c_str(), g_self.c_str(), "--peer", r.c_str(), w.c_str(), b.c_str(), nullptr);
    _exit(127);
  }
  ::close(toPeer[0]);
  ::close(fromPeer[1]);
  wfd = toPeer[1];
  rfd = fromPeer[0];
  endpoint = recvBlob(rfd);
  descriptor = recvBlob(rfd);
}

PeerProcess::~PeerProcess() {
  if (wfd >= 0) ::close(wfd);
  if (rfd >= 0) ::close(rfd);
  if (pid > 0) {
    ::kill(pid, SIGCONT);
    // Closing the command pipe ends the peer; kill it if it does not end by itself.
    for (int i = 0; i < 500; ++i) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) return;
      std::this_thread::sleep_for(10ms);
    }
    ::kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
}

bool PeerProcess::verify(uint64_t seed, uint64_t offset, uint64_t len) {
  std::vector<uint8_t> cmd(24);
  std::memcpy(cmd.data(), &seed, 8);
  std::memcpy(cmd.data() + 8, &offset, 8);
  std::memcpy(cmd.data() + 16, &len, 8);
  sendBlob(wfd, cmd);
  auto r = recvBlob(rfd);
  return r.size() == 1 && r[0] == 1;
}

void PeerProcess::killNow() {
  ::kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  pid = -1;
}

PeerLink::PeerLink(size_t bytes) : peer(bytes), t(makeTransport(0)), src(bytes) {
  mem = t->registerMemory(src.data, bytes, MemoryKind::Host, nullptr);
  remote = t->importMemory(peerInfo(1, peer.pid), peer.descriptor, bytes, MemoryKind::Host);
  conn = t->connect(peerInfo(1, peer.pid), peer.endpoint);
}

Pair::Pair(size_t srcBytes, size_t dstBytes) : src(srcBytes), dst(dstBytes) {
  a = makeTransport(0);
  b = makeTransport(1);
  srcMem = a->registerMemory(src.data, src.size, MemoryKind::Host, nullptr);
  dstMem = b->registerMemory(dst.data, dst.size, MemoryKind::Host, nullptr);
  remote = a->importMemory(peerInfo(1), dstMem->descriptor(), dst.size, MemoryKind::Host);
  conn = a->connect(peerInfo(1), b->endpoint());
}
