// The shm transport through the plugin SDK alone (the core is not involved): registration and
// descriptors, imports in this process and in forked children (which open the parent's
// /proc/<pid>/fd), writes of 1 B to 64 MiB at odd offsets, updateAndSync ordering across
// threads and processes, user memory through process_vm_writev, corrupt descriptors, peer death,
// and leaks (stats and open fds). Children report through their exit status; they never return
// into Boost.Test.

#define BOOST_TEST_MODULE shm_transport
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <strata/error.hpp>

#include "backends/transport/shm/shm_transport.hpp"
#include "base/wire.hpp"

namespace {

using namespace strata;
using namespace strata::backend;
using strata::shm::createShmTransport;
using strata::shm::decodeDescriptor;
using strata::shm::DescriptorMode;
using strata::shm::encodeDescriptor;
using strata::shm::MemoryDescriptor;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kHostId = 0x5eed5eedull;
constexpr size_t kMiB = size_t{1} << 20;

std::unique_ptr<Transport> makeTransport(int rank) {
  TransportInit init;
  init.rank = rank;
  init.size = 2;
  init.localRank = rank;
  init.localSize = 2;
  init.hostId = kHostId;
  return createShmTransport(init);
}

PeerInfo peerOf(int rank, pid_t pid) {
  PeerInfo p;
  p.rank = rank;
  p.sameHost = true;
  p.hostId = kHostId;
  p.hostName = "localhost";
  p.pid = pid;
  return p;
}

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

uint8_t pattern(size_t i, uint32_t seed) {
  return static_cast<uint8_t>(i * 131u + seed * 7u + (i >> 9) + (seed >> 3));
}
void fill(char* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>(pattern(i, seed));
}
// Index of the first wrong byte, or n.
size_t firstMismatch(const char* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<uint8_t>(p[i]) != pattern(i, seed)) return i;
  }
  return n;
}

// Runs fn in a forked child; its exit status is 0 on success, 1 on a failed check or an
// exception (printed), 3 for NotSupported.
pid_t runChild(const std::function<void()>& fn) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int status = 0;
    try {
      fn();
    } catch (const Error& e) {
      std::fprintf(stderr, "child %d: strata::Error(%s): %s\n", getpid(),
                   std::string(toString(e.code())).c_str(), e.what());
      status = e.code() == ErrorCode::NotSupported ? 3 : 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", getpid(), e.what());
      status = 1;
    }
    std::fflush(nullptr);
    _exit(status);
  }
  return pid;
}

// The child's exit status, or -1 if it died of a signal; kills it after timeoutSeconds.
int waitChild(pid_t pid, double timeoutSeconds = 120) {
  auto deadline = Clock::now() + std::chrono::duration<double>(timeoutSeconds);
  int status = 0;
  while (true) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

// Expects fn to throw strata::Error with that code (and peer, if >= -1 given as expectedPeer).
void expectError(ErrorCode code, const std::function<void()>& fn, const std::string& what,
                 int expectedPeer = -2) {
  try {
    fn();
  } catch (const Error& e) {
    if (e.code() != code) {
      throw std::runtime_error(what + ": expected " + std::string(toString(code)) + ", got " +
                               std::string(toString(e.code())) + ": " + e.what());
    }
    if (expectedPeer >= -1 && e.peer() != expectedPeer) {
      throw std::runtime_error(what + ": error names peer " + std::to_string(e.peer()) +
                               ", expected " + std::to_string(expectedPeer));
    }
    return;
  }
  throw std::runtime_error(what + ": no error thrown");
}

// Pipes for small messages between parent and child, read with a deadline.
struct Pipe {
  int fds[2] = {-1, -1};
  Pipe() {
    if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
  }
  ~Pipe() {
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
  }
  void send(const std::vector<uint8_t>& data) const {
    uint32_t n = static_cast<uint32_t>(data.size());
    check(::write(fds[1], &n, 4) == 4, "pipe write");
    if (n > 0) check(::write(fds[1], data.data(), n) == static_cast<ssize_t>(n), "pipe write");
  }
  std::vector<uint8_t> receive(double timeoutSeconds = 60) const {
    auto readExact = [&](void* p, size_t n) {
      size_t done = 0;
      auto deadline = Clock::now() + std::chrono::duration<double>(timeoutSeconds);
      while (done < n) {
        pollfd pf{fds[0], POLLIN, 0};
        int ms = static_cast<int>(
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
        check(ms > 0 && poll(&pf, 1, ms) == 1, "pipe read timed out");
        ssize_t r = ::read(fds[0], static_cast<char*>(p) + done, n - done);
        check(r > 0, "pipe closed");
        done += static_cast<size_t>(r);
      }
    };
    uint32_t n = 0;
    readExact(&n, 4);
    std::vector<uint8_t> data(n);
    if (n > 0) readExact(data.data(), n);
    return data;
  }
};

size_t countOpenFds() {
  size_t n = 0;
  DIR* dir = opendir("/proc/self/fd");
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

// Waits until the 8-byte word at p reaches value (acquire), yielding; false on timeout.
bool waitWord(const Transport& t, void* base, uint64_t offset, uint64_t value,
              double timeoutSeconds = 30) {
  LocalRef ref{base, offset + 8, MemoryKind::Host, nullptr};
  auto deadline = Clock::now() + std::chrono::duration<double>(timeoutSeconds);
  auto& mutableT = const_cast<Transport&>(t);
  for (uint32_t spins = 0;; ++spins) {
    if (mutableT.loadSignal(ref, offset) >= value) return true;
    if ((spins & 255) == 0 && Clock::now() > deadline) return false;
    sched_yield();
  }
}

bool ptraceRestricted() {
  FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  if (f == nullptr) return false;
  int scope = 0;
  if (std::fscanf(f, "%d", &scope) != 1) scope = 0;
  std::fclose(f);
  return scope > 0;
}

bool isZero(const TransportStats& s) {
  return s.registrations == 0 && s.imports == 0 && s.connections == 0;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(shm)

BOOST_AUTO_TEST_CASE(capabilities) {
  auto t = makeTransport(0);
  BOOST_TEST(t->name() == "shm");
  BOOST_TEST(t->supportsMemory(MemoryKind::Host));
  BOOST_TEST(!t->supportsMemory(MemoryKind::Cuda));
  BOOST_TEST(t->canReach(peerOf(1, 1)));
  PeerInfo remote = peerOf(1, 1);
  remote.sameHost = false;
  BOOST_TEST(!t->canReach(remote));
  BOOST_TEST((t->signalMemoryKind() == MemoryKind::Host));

  std::vector<char> buf(64);
  try {
    t->registerMemory(buf.data(), buf.size(), MemoryKind::Cuda, nullptr);
    BOOST_FAIL("registering cuda memory must throw");
  } catch (const Error& e) {
    BOOST_TEST((e.code() == ErrorCode::NotSupported));
    BOOST_TEST_MESSAGE(e.what());
  }
  BOOST_CHECK_THROW(t->registerMemory(buf.data(), 0, MemoryKind::Host, nullptr), Error);
  BOOST_TEST(isZero(t->stats()));
}

BOOST_AUTO_TEST_CASE(descriptor_round_trip) {
  MemoryDescriptor d;
  d.mode = DescriptorMode::Memfd;
  d.pid = 4242;
  d.hostId = 7;
  d.nonce = 0x0123456789abcdefull;
  d.address = 0x7f0000001000ull;
  d.size = 12345;
  d.fd = 17;
  d.inode = 987654321;
  d.offset = 4096 + 24;
  auto rec = encodeDescriptor(d);
  auto back = decodeDescriptor(rec, "test descriptor");
  BOOST_TEST((back.mode == d.mode));
  BOOST_TEST(back.pid == d.pid);
  BOOST_TEST(back.hostId == d.hostId);
  BOOST_TEST(back.nonce == d.nonce);
  BOOST_TEST(back.address == d.address);
  BOOST_TEST(back.size == d.size);
  BOOST_TEST(back.fd == d.fd);
  BOOST_TEST(back.inode == d.inode);
  BOOST_TEST(back.offset == d.offset);

  d.mode = DescriptorMode::User;
  auto urec = encodeDescriptor(d);
  BOOST_TEST(urec.size() + 20 == rec.size());  // no fd, inode, offset in user mode
  auto uback = decodeDescriptor(urec, "test descriptor");
  BOOST_TEST((uback.mode == DescriptorMode::User));
  BOOST_TEST(uback.fd == -1);

  // What registerMemory produces.
  auto t = makeTransport(0);
  MemfdBuffer buf(8192, 4096 + 24);
  HostAllocation a = buf.alloc();
  auto m1 = t->registerMemory(buf.data(), buf.size, MemoryKind::Host, &a);
  auto m2 = t->registerMemory(buf.data(), 100, MemoryKind::Host, &a);
  auto r1 = decodeDescriptor(m1->descriptor(), "registered");
  auto r2 = decodeDescriptor(m2->descriptor(), "registered");
  BOOST_TEST((r1.mode == DescriptorMode::Memfd));
  BOOST_TEST(r1.pid == getpid());
  BOOST_TEST(r1.hostId == kHostId);
  BOOST_TEST(r1.fd == buf.fd);
  BOOST_TEST(r1.inode == buf.inode);
  BOOST_TEST(r1.offset == buf.offset);
  BOOST_TEST(r1.size == buf.size);
  BOOST_TEST(r1.address == reinterpret_cast<uint64_t>(buf.data()));
  BOOST_TEST(r1.nonce != 0u);
  BOOST_TEST(r1.nonce != r2.nonce);
  BOOST_TEST(t->stats().registrations == 2u);

  // A wrong HostAllocation is refused at registration.
  HostAllocation wrongInode{buf.fd, buf.inode + 1, buf.offset};
  BOOST_CHECK_THROW(t->registerMemory(buf.data(), buf.size, MemoryKind::Host, &wrongInode), Error);
  HostAllocation tooLong{buf.fd, buf.inode, buf.offset + 1};
  BOOST_CHECK_THROW(t->registerMemory(buf.data(), buf.size, MemoryKind::Host, &tooLong), Error);
}

BOOST_AUTO_TEST_CASE(in_process_import_write_and_signal) {
  auto t = makeTransport(0);
  MemfdBuffer buf(1 * kMiB, 24);
  HostAllocation a = buf.alloc();
  auto local = t->registerMemory(buf.data(), buf.size, MemoryKind::Host, &a);
  auto desc = local->descriptor();
  auto remote = t->importMemory(peerOf(0, getpid()), desc, buf.size, MemoryKind::Host);
  BOOST_TEST(remote->hostPointer() == static_cast<void*>(buf.data()));
  auto conn = t->connect(peerOf(0, getpid()), t->endpoint());
  conn->checkPeer();

  std::vector<char> src(70000);
  fill(src.data(), src.size(), 5);
  RemoteRef dst{buf.size, MemoryKind::Host, remote.get()};
  LocalRef from{src.data(), src.size(), MemoryKind::Host, nullptr};
  conn->write(dst, 1001, from, 3, 65537);
  conn->updateAndSync(dst, 8, 77);
  conn->flush(1.0);
  BOOST_TEST(std::memcmp(buf.data() + 1001, src.data() + 3, 65537) == 0);
  BOOST_TEST(t->loadSignal(LocalRef{buf.data(), buf.size, MemoryKind::Host, nullptr}, 8) == 77u);

  std::vector<char> user(4096);
  auto ulocal = t->registerMemory(user.data(), user.size(), MemoryKind::Host, nullptr);
  auto uremote =
      t->importMemory(peerOf(0, getpid()), ulocal->descriptor(), user.size(), MemoryKind::Host);
  BOOST_TEST(uremote->hostPointer() == static_cast<void*>(user.data()));

  BOOST_TEST(t->stats().registrations == 2u);
  BOOST_TEST(t->stats().imports == 2u);
  BOOST_TEST(t->stats().connections == 1u);

  // Released registration: its descriptor is stale for this (owner) process.
  local.reset();
  try {
    t->importMemory(peerOf(0, getpid()), desc, buf.size, MemoryKind::Host);
    BOOST_FAIL("importing a released registration must throw");
  } catch (const Error& e) {
    BOOST_TEST((e.code() == ErrorCode::ProtocolError));
    BOOST_TEST(std::string(e.what()).find("stale") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(cuda_write_not_supported) {
  auto t = makeTransport(0);
  MemfdBuffer buf(4096, 0);
  HostAllocation a = buf.alloc();
  auto local = t->registerMemory(buf.data(), buf.size, MemoryKind::Host, &a);
  BOOST_CHECK_THROW(
      t->importMemory(peerOf(0, getpid()), local->descriptor(), buf.size, MemoryKind::Cuda), Error);
  auto remote =
      t->importMemory(peerOf(0, getpid()), local->descriptor(), buf.size, MemoryKind::Host);
  auto conn = t->connect(peerOf(0, getpid()), t->endpoint());
  char src[8] = {};
  try {
    conn->write(RemoteRef{buf.size, MemoryKind::Host, remote.get()}, 0,
                LocalRef{src, 8, MemoryKind::Cuda, nullptr}, 0, 8);
    BOOST_FAIL("cuda source must throw");
  } catch (const Error& e) {
    BOOST_TEST((e.code() == ErrorCode::NotSupported));
  }
}

// The parent registers a memfd buffer; a forked child imports it through /proc/<ppid>/fd and
// writes patterns of 1 B .. 64 MiB at odd offsets; the parent checks every byte and the gaps.
BOOST_AUTO_TEST_CASE(fork_import_writes_at_odd_offsets) {
  const std::vector<size_t> sizes = {1, 3, 17, 4095, 4097, 65537, kMiB + 7, 64 * kMiB};
  std::vector<size_t> offsets;
  size_t cursor = 1;
  for (size_t s : sizes) {
    offsets.push_back(cursor);
    cursor += s + 3;
  }
  const size_t total = cursor + 64;
  auto t = makeTransport(0);
  MemfdBuffer buf(total, 4096 + 40);  // the buffer starts mid-page in its memfd
  HostAllocation a = buf.alloc();
  auto local = t->registerMemory(buf.data(), buf.size, MemoryKind::Host, &a);
  const auto desc = local->descriptor();
  const auto endpoint = t->endpoint();
  const pid_t parent = getpid();

  pid_t child = runChild([&] {
    auto ct = makeTransport(1);
    auto remote = ct->importMemory(peerOf(0, parent), desc, total, MemoryKind::Host);
    check(remote->hostPointer() != nullptr, "mapped pointer");
    auto conn = ct->connect(peerOf(0, parent), endpoint);
    std::vector<char> src(64 * kMiB + 16);
    RemoteRef dst{total, MemoryKind::Host, remote.get()};
    for (size_t i = 0; i < sizes.size(); ++i) {
      const size_t srcOffset = 5 + i;
      fill(src.data() + srcOffset, sizes[i], static_cast<uint32_t>(i + 1));
      conn->write(dst, offsets[i], LocalRef{src.data(), src.size(), MemoryKind::Host, nullptr},
                  srcOffset, sizes[i]);
    }
    conn->flush(10);
    conn->checkPeer();
    check(ct->stats().imports == 1 && ct->stats().connections == 1, "child stats");
  });
  BOOST_TEST_REQUIRE(waitChild(child) == 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    BOOST_TEST(
        firstMismatch(buf.data() + offsets[i], sizes[i], static_cast<uint32_t>(i + 1)) == sizes[i],
        "write " << i << " of " << sizes[i] << " bytes at " << offsets[i]);
    const char* gap = buf.data() + offsets[i] + sizes[i];
    BOOST_TEST((gap[0] == 0 && gap[1] == 0 && gap[2] == 0), "no overrun after write " << i);
  }
  BOOST_TEST(buf.data()[0] == 0);
  BOOST_TEST(buf.base[buf.offset - 1] == 0);  // nothing before the buffer either
}

namespace {
// One writer, one reader; the reader acknowledges each round in the ack word, so the writer
// never overwrites data the reader is still checking.
constexpr uint64_t kCounterOffset = 0;
constexpr uint64_t kAckOffset = 64;
constexpr uint64_t kDataOffset = 4096;
constexpr size_t kMaxRoundBytes = 8 * kMiB;
size_t roundBytes(uint64_t round) {
  if (round % 97 == 0) return kMaxRoundBytes;  // large enough for non-temporal memcpy stores
  return 1 + (round * 7919) % (256 * 1024);
}

void writerRounds(Transport& t, TransportConnection& conn, RemoteMemory& remote, size_t total,
                  uint64_t rounds) {
  std::vector<char> src(kMaxRoundBytes);
  char* mapped = static_cast<char*>(remote.hostPointer());
  check(mapped != nullptr, "writer mapping");
  RemoteRef dst{total, MemoryKind::Host, &remote};
  for (uint64_t round = 1; round <= rounds; ++round) {
    check(waitWord(t, mapped, kAckOffset, round - 1), "writer: ack timed out");
    const size_t n = roundBytes(round);
    fill(src.data(), n, static_cast<uint32_t>(round));
    conn.write(dst, kDataOffset, LocalRef{src.data(), src.size(), MemoryKind::Host, nullptr}, 0, n);
    conn.updateAndSync(dst, kCounterOffset, round);
  }
}

// Returns the first bad round, or 0.
uint64_t readerRounds(Transport& t, char* data, uint64_t rounds) {
  for (uint64_t round = 1; round <= rounds; ++round) {
    if (!waitWord(t, data, kCounterOffset, round)) return round;
    const size_t n = roundBytes(round);
    if (firstMismatch(data + kDataOffset, n, static_cast<uint32_t>(round)) != n) return round;
    __atomic_store_n(reinterpret_cast<uint64_t*>(data + kAckOffset), round, __ATOMIC_RELEASE);
  }
  return 0;
}
}  // namespace

BOOST_AUTO_TEST_CASE(update_and_sync_ordering_threads) {
  const uint64_t rounds = 2000;
  const size_t total = kDataOffset + kMaxRoundBytes;
  auto t = makeTransport(0);
  MemfdBuffer buf(total, 0);
  HostAllocation a = buf.alloc();
  auto local = t->registerMemory(buf.data(), total, MemoryKind::Host, &a);
  auto remote = t->importMemory(peerOf(0, getpid()), local->descriptor(), total, MemoryKind::Host);
  auto conn = t->connect(peerOf(0, getpid()), t->endpoint());
  std::string writerError;
  std::thread writer([&] {
    try {
      writerRounds(*t, *conn, *remote, total, rounds);
    } catch (const std::exception& e) {
      writerError = e.what();
    }
  });
  uint64_t bad = readerRounds(*t, buf.data(), rounds);
  writer.join();
  BOOST_TEST(writerError.empty(), writerError);
  BOOST_TEST(bad == 0u, "first bad round " << bad);
}

BOOST_AUTO_TEST_CASE(update_and_sync_ordering_processes) {
  const uint64_t rounds = 2000;
  const size_t total = kDataOffset + kMaxRoundBytes;
  auto t = makeTransport(0);
  MemfdBuffer buf(total, 8);  // the counter sits mid-page in the memfd; still 8-byte aligned
  HostAllocation a = buf.alloc();
  auto local = t->registerMemory(buf.data(), total, MemoryKind::Host, &a);
  const auto desc = local->descriptor();
  const auto endpoint = t->endpoint();
  const pid_t parent = getpid();
  pid_t child = runChild([&] {
    auto ct = makeTransport(1);
    auto remote = ct->importMemory(peerOf(0, parent), desc, total, MemoryKind::Host);
    auto conn = ct->connect(peerOf(0, parent), endpoint);
    writerRounds(*ct, *conn, *remote, total, rounds);
  });
  uint64_t bad = readerRounds(*t, buf.data(), rounds);
  BOOST_TEST(waitChild(child) == 0);
  BOOST_TEST(bad == 0u, "first bad round " << bad);
}

// User memory (not from a memfd): the child writes into the parent with process_vm_writev.
BOOST_AUTO_TEST_CASE(user_memory_process_vm_writev) {
  auto t = makeTransport(0);
  std::vector<char> user(3 * kMiB + 64, 0);
  auto local = t->registerMemory(user.data(), user.size(), MemoryKind::Host, nullptr);
  BOOST_TEST((decodeDescriptor(local->descriptor(), "user").mode == DescriptorMode::User));
  const auto desc = local->descriptor();
  const auto endpoint = t->endpoint();
  const pid_t parent = getpid();
  // Under Yama ptrace_scope 1 a child may not touch its parent; the owner opts in (docs).
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  pid_t child = runChild([&] {
    auto ct = makeTransport(1);
    auto remote = ct->importMemory(peerOf(0, parent), desc, user.size(), MemoryKind::Host);
    check(remote->hostPointer() == nullptr, "user memory of another process is not mapped");
    auto conn = ct->connect(peerOf(0, parent), endpoint);
    std::vector<char> src(3 * kMiB + 64);
    fill(src.data(), src.size(), 9);
    RemoteRef dst{user.size(), MemoryKind::Host, remote.get()};
    LocalRef from{src.data(), src.size(), MemoryKind::Host, nullptr};
    conn->write(dst, 1, from, 0, 1);
    conn->write(dst, 33, from, 7, 3 * kMiB + 1);
    conn->updateAndSync(dst, 3 * kMiB + 48, 0x1122334455667788ull);
    conn->flush(1);
    // Beyond the owner's mapping: EFAULT becomes a ProtocolError naming the peer.
    RemoteRef wild{user.size(), MemoryKind::Host, remote.get()};
    expectError(
        ErrorCode::ProtocolError, [&] { conn->write(wild, uint64_t{1} << 46, from, 0, 8); },
        "write past the mapping", 0);
  });
  int status = waitChild(child);
  prctl(PR_SET_PTRACER, 0, 0, 0, 0);
  if (status == 3 && ptraceRestricted()) {
    BOOST_TEST_MESSAGE(
        "process_vm_writev refused by Yama ptrace_scope: NotSupported, as documented");
    return;
  }
  BOOST_TEST_REQUIRE(status == 0);
  BOOST_TEST(firstMismatch(user.data() + 1, 1, 9) == 1u);
  // The second write took src + 7: compare against the pattern shifted by 7.
  bool ok = true;
  for (size_t i = 0; i < 3 * kMiB + 1 && ok; ++i) {
    ok = static_cast<uint8_t>(user[33 + i]) == pattern(i + 7, 9);
  }
  BOOST_TEST(ok);
  BOOST_TEST(user[0] == 0);
  BOOST_TEST(user[2] == 0);
  uint64_t word = 0;
  std::memcpy(&word, user.data() + 3 * kMiB + 48, 8);
  BOOST_TEST(word == 0x1122334455667788ull);
}

// The parent writes into a child's user memory; after the child is killed, writes and imports
// report PeerLost.
BOOST_AUTO_TEST_CASE(user_memory_of_dead_peer) {
  Pipe toParent, toChild;
  pid_t child = runChild([&] {
    auto ct = makeTransport(1);
    std::vector<char> user(4096, 0);
    auto local = ct->registerMemory(user.data(), user.size(), MemoryKind::Host, nullptr);
    MemfdBuffer buf(4096, 0);
    HostAllocation a = buf.alloc();
    auto mlocal = ct->registerMemory(buf.data(), buf.size, MemoryKind::Host, &a);
    toParent.send(local->descriptor());
    toParent.send(mlocal->descriptor());
    toParent.send(ct->endpoint());
    toChild.receive(120);  // parent wrote; check, then wait to be killed
    check(firstMismatch(user.data() + 100, 1000, 3) == 1000, "parent's write into child");
    toParent.send({1});
    toChild.receive(120);
  });
  auto t = makeTransport(0);
  auto udesc = toParent.receive();
  auto mdesc = toParent.receive();
  auto endpoint = toParent.receive();
  {
    auto remote = t->importMemory(peerOf(1, child), udesc, 4096, MemoryKind::Host);
    auto conn = t->connect(peerOf(1, child), endpoint);
    std::vector<char> src(1000);
    fill(src.data(), src.size(), 3);
    conn->write(RemoteRef{4096, MemoryKind::Host, remote.get()}, 100,
                LocalRef{src.data(), src.size(), MemoryKind::Host, nullptr}, 0, src.size());
    toChild.send({1});
    BOOST_TEST(toParent.receive() == std::vector<uint8_t>{1});
    kill(child, SIGKILL);
    BOOST_TEST(waitChild(child) == -1);
    try {
      conn->write(RemoteRef{4096, MemoryKind::Host, remote.get()}, 100,
                  LocalRef{src.data(), src.size(), MemoryKind::Host, nullptr}, 0, src.size());
      BOOST_FAIL("write into a dead process must throw");
    } catch (const Error& e) {
      BOOST_TEST((e.code() == ErrorCode::PeerLost));
      BOOST_TEST(e.peer() == 1);
      BOOST_TEST_MESSAGE(e.what());
    }
  }
  BOOST_CHECK_THROW(t->importMemory(peerOf(1, child), mdesc, 4096, MemoryKind::Host), Error);
  try {
    t->importMemory(peerOf(1, child), mdesc, 4096, MemoryKind::Host);
  } catch (const Error& e) {
    BOOST_TEST((e.code() == ErrorCode::PeerLost));
  }
  BOOST_TEST(isZero(t->stats()));
}

// Corrupt and mismatching descriptors, imported in a child (so that the /proc path runs).
BOOST_AUTO_TEST_CASE(corrupt_descriptors_rejected) {
  auto t = makeTransport(0);
  MemfdBuffer buf(8192, 4096 + 24);
  HostAllocation a = buf.alloc();
  auto local = t->registerMemory(buf.data(), buf.size, MemoryKind::Host, &a);
  const auto desc = local->descriptor();
  const auto endpoint = t->endpoint();
  const pid_t parent = getpid();
  const size_t size = buf.size;

  pid_t child = runChild([&] {
    auto ct = makeTransport(1);
    const PeerInfo owner = peerOf(0, parent);
    auto importIt = [&](const std::vector<uint8_t>& d, size_t bytes = 0) {
      ct->importMemory(owner, d, bytes ? bytes : size, MemoryKind::Host);
    };
    auto mutate = [&](auto change) {
      MemoryDescriptor d = decodeDescriptor(desc, "valid");
      change(d);
      return encodeDescriptor(d);
    };
    auto pe = ErrorCode::ProtocolError;
    // The valid one works.
    importIt(desc);
    // Bad version: the u16 at offset 4.
    auto v = desc;
    v[4] = 2;
    expectError(
        pe, [&] { importIt(v); }, "version 2", 0);
    v[4] = 0;
    expectError(
        pe, [&] { importIt(v); }, "version 0", 0);
    // Bad magic, wrong kind.
    v = desc;
    v[0] ^= 1;
    expectError(
        pe, [&] { importIt(v); }, "bad magic", 0);
    expectError(
        pe, [&] { importIt(endpoint); }, "endpoint record as descriptor", 0);
    // Truncated: every shorter prefix; and a body cut short with a consistent header.
    for (size_t n = 0; n < desc.size(); ++n) {
      std::vector<uint8_t> cut(desc.begin(), desc.begin() + static_cast<long>(n));
      expectError(
          pe, [&] { importIt(cut); }, "truncated to " + std::to_string(n), 0);
    }
    {
      auto body = strata::wire::decodeRecord(desc, strata::shm::kDescriptorKind, 1, 256, "x").body;
      std::vector<uint8_t> shortBody(body.begin(), body.end() - 8);
      auto rec = strata::wire::encodeRecord(strata::shm::kDescriptorKind, 1, shortBody);
      expectError(
          pe, [&] { importIt(rec); }, "short body", 0);
      std::vector<uint8_t> longBody(body.begin(), body.end());
      longBody.push_back(0);
      rec = strata::wire::encodeRecord(strata::shm::kDescriptorKind, 1, longBody);
      expectError(
          pe, [&] { importIt(rec); }, "trailing byte", 0);
    }
    // Fields.
    expectError(
        pe, [&] { importIt(mutate([](auto& d) { d.pid = getpid(); })); }, "pid of another", 0);
    expectError(
        pe, [&] { ct->importMemory(peerOf(0, parent + 1), desc, size, MemoryKind::Host); },
        "bootstrap pid differs", 0);
    expectError(
        pe, [&] { importIt(mutate([](auto& d) { d.inode += 1; })); }, "wrong inode", 0);
    expectError(
        pe, [&] { importIt(mutate([](auto& d) { d.hostId += 1; })); }, "wrong host id", 0);
    expectError(
        pe, [&] { importIt(desc, size + 1); }, "size differs from the record", 0);
    expectError(
        pe, [&] { importIt(mutate([](auto& d) { d.size += 1; }), size + 1); },
        "range past the memfd end", 0);
    expectError(
        pe, [&] { importIt(mutate([](auto& d) { d.offset = ~uint64_t{0} - 5; })); },
        "offset overflow", 0);
    expectError(
        pe, [&] { importIt(mutate([](auto& d) { d.fd = 999; })); }, "closed fd", 0);
    expectError(
        pe, [&] { importIt(mutate([](auto& d) { d.fd = -1; })); }, "negative fd", 0);
    auto badMode = desc;
    badMode[strata::wire::kRecordHeaderSize] = 9;
    expectError(
        pe, [&] { importIt(badMode); }, "unknown mode", 0);
    // Not on this host, or not host memory.
    PeerInfo far = owner;
    far.sameHost = false;
    expectError(
        ErrorCode::NotSupported, [&] { ct->importMemory(far, desc, size, MemoryKind::Host); },
        "other host", 0);
    // Endpoints.
    expectError(
        pe, [&] { ct->connect(peerOf(0, parent + 1), endpoint); }, "endpoint pid", 0);
    std::vector<uint8_t> cutEp(endpoint.begin(), endpoint.end() - 1);
    expectError(
        pe, [&] { ct->connect(owner, cutEp); }, "truncated endpoint", 0);
    expectError(
        pe, [&] { ct->connect(owner, desc); }, "descriptor as endpoint", 0);
    expectError(
        ErrorCode::NotSupported, [&] { ct->connect(far, endpoint); }, "endpoint far", 0);
    check(isZero(ct->stats()), "child stats after failures");
  });
  BOOST_TEST(waitChild(child) == 0);

  // In the owner process every single-bit flip of the descriptor is refused (the live
  // registration table checks every field), and so is every truncation.
  size_t accepted = 0;
  for (size_t bit = 0; bit < desc.size() * 8; ++bit) {
    auto d = desc;
    d[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    try {
      t->importMemory(peerOf(0, getpid()), d, size, MemoryKind::Host);
      ++accepted;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::ProtocolError) ++accepted;
    }
  }
  BOOST_TEST(accepted == 0u);
  BOOST_TEST(t->stats().imports == 0u);
}

BOOST_AUTO_TEST_CASE(check_peer_after_sigkill) {
  auto t = makeTransport(0);
  for (bool reap : {true, false}) {
    Pipe toChild;
    pid_t child = runChild([&] { toChild.receive(120); });
    wire::Writer w;
    w.i32(child).u64(kHostId);
    auto endpoint = wire::encodeRecord(strata::shm::kEndpointKind, 1, w.data());
    auto conn = t->connect(peerOf(3, child), endpoint);
    BOOST_CHECK_NO_THROW(conn->checkPeer());
    kill(child, SIGKILL);
    if (reap) BOOST_TEST(waitChild(child) == -1);
    // Without reaping, the exit becomes visible a moment later (a zombie has exited).
    bool lost = false;
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!lost && Clock::now() < deadline) {
      try {
        conn->checkPeer();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      } catch (const Error& e) {
        lost = true;
        BOOST_TEST((e.code() == ErrorCode::PeerLost));
        BOOST_TEST(e.peer() == 3);
        const std::string msg = e.what();
        BOOST_TEST(msg.find("rank 3") != std::string::npos, msg);
        BOOST_TEST(msg.find("pid " + std::to_string(child)) != std::string::npos, msg);
        BOOST_TEST(msg.find("shm") != std::string::npos, msg);
      }
    }
    BOOST_TEST(lost, (reap ? "reaped" : "zombie") << " child not reported lost");
    BOOST_CHECK_THROW(conn->checkPeer(), Error);  // stays lost
    if (!reap) BOOST_TEST(waitChild(child) == -1);
    conn.reset();
    // Connecting to a process that is gone fails at once.
    try {
      t->connect(peerOf(3, child), endpoint);
      BOOST_FAIL("connect to a dead pid must throw");
    } catch (const Error& e) {
      BOOST_TEST((e.code() == ErrorCode::PeerLost));
    }
  }
  BOOST_TEST(isZero(t->stats()));
}

BOOST_AUTO_TEST_CASE(stats_and_fds_after_100_cycles) {
  Pipe toParent, toChild;
  pid_t child = runChild([&] {
    auto ct = makeTransport(1);
    MemfdBuffer buf(64 * 1024, 100);
    HostAllocation a = buf.alloc();
    auto local = ct->registerMemory(buf.data(), buf.size, MemoryKind::Host, &a);
    toParent.send(local->descriptor());
    toParent.send(ct->endpoint());
    toChild.receive(120);
    check(buf.data()[99] == 99, "the parent's last write reached the child");
  });
  auto desc = toParent.receive();
  auto endpoint = toParent.receive();
  auto t = makeTransport(0);
  const size_t fdsBefore = countOpenFds();
  for (int i = 0; i < 100; ++i) {
    MemfdBuffer own(4096 + static_cast<size_t>(i), static_cast<size_t>(i));
    HostAllocation a = own.alloc();
    auto local = t->registerMemory(own.data(), own.size, MemoryKind::Host, &a);
    auto self =
        t->importMemory(peerOf(0, getpid()), local->descriptor(), own.size, MemoryKind::Host);
    auto remote = t->importMemory(peerOf(1, child), desc, 64 * 1024, MemoryKind::Host);
    auto conn = t->connect(peerOf(1, child), endpoint);
    char byte = static_cast<char>(i);
    conn->write(RemoteRef{64 * 1024, MemoryKind::Host, remote.get()}, static_cast<uint64_t>(i),
                LocalRef{&byte, 1, MemoryKind::Host, nullptr}, 0, 1);
    conn->checkPeer();
    auto s = t->stats();
    BOOST_TEST_REQUIRE((s.registrations == 1 && s.imports == 2 && s.connections == 1));
  }
  BOOST_TEST(isZero(t->stats()));
  BOOST_TEST(countOpenFds() == fdsBefore);
  toChild.send({1});
  BOOST_TEST(waitChild(child) == 0);
}

// Not a pass/fail timing: prints what a 64 MiB write costs next to plain memcpy.
BOOST_AUTO_TEST_CASE(bandwidth_64mib_report) {
  const size_t n = 64 * kMiB;
  const int iterations = 8;
  auto t = makeTransport(0);
  MemfdBuffer buf(n, 0);
  HostAllocation a = buf.alloc();
  auto local = t->registerMemory(buf.data(), n, MemoryKind::Host, &a);
  std::vector<char> user(n, 1);
  auto ulocal = t->registerMemory(user.data(), n, MemoryKind::Host, nullptr);
  const auto desc = local->descriptor();
  const auto udesc = ulocal->descriptor();
  const auto endpoint = t->endpoint();
  const pid_t parent = getpid();
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  pid_t child = runChild([&] {
    auto ct = makeTransport(1);
    auto remote = ct->importMemory(peerOf(0, parent), desc, n, MemoryKind::Host);
    auto conn = ct->connect(peerOf(0, parent), endpoint);
    std::vector<char> src(n, 2), dst(n, 3);
    auto gbps = [&](auto&& op) {
      op();  // warm: page faults
      auto start = Clock::now();
      for (int i = 0; i < iterations; ++i) op();
      double s = std::chrono::duration<double>(Clock::now() - start).count();
      return static_cast<double>(n) * iterations / s / 1e9;
    };
    RemoteRef rdst{n, MemoryKind::Host, remote.get()};
    LocalRef from{src.data(), n, MemoryKind::Host, nullptr};
    double shmBw = gbps([&] { conn->write(rdst, 0, from, 0, n); });
    double memcpyBw = gbps([&] { std::memcpy(dst.data(), src.data(), n); });
    std::printf(
        "shm write 64 MiB into a peer's memfd mapping: %.2f GB/s; plain memcpy in one "
        "process: %.2f GB/s\n",
        shmBw, memcpyBw);
    try {
      auto uremote = ct->importMemory(peerOf(0, parent), udesc, n, MemoryKind::Host);
      RemoteRef udst{n, MemoryKind::Host, uremote.get()};
      double vmBw = gbps([&] { conn->write(udst, 0, from, 0, n); });
      std::printf("shm write 64 MiB into a peer's user memory (process_vm_writev): %.2f GB/s\n",
                  vmBw);
    } catch (const Error& e) {
      std::printf("process_vm_writev not measured: %s\n", e.what());
    }
  });
  BOOST_TEST(waitChild(child) == 0);
  prctl(PR_SET_PTRACER, 0, 0, 0, 0);
}

BOOST_AUTO_TEST_SUITE_END()

int main(int argc, char** argv) {
  int fd = memfd_create("strata-shm-probe", MFD_CLOEXEC);
  if (fd < 0) {
    std::printf("skipped: memfd_create is not available (%s)\n", std::strerror(errno));
    return 77;
  }
  close(fd);
  if (access("/proc/self/fd", R_OK) != 0) {
    std::printf("skipped: /proc is not mounted\n");
    return 77;
  }
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
