// The shm transport, part of test_shm_transport.cpp's suite: updateAndSync orders data before
// the signal between threads and between processes; user memory (not from a memfd) written
// through process_vm_writev, and a peer's user memory after the peer died.

#include <boost/test/unit_test.hpp>

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/transport/shm/shm_fixtures.hpp"

BOOST_AUTO_TEST_SUITE(shm)

namespace {

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
    fillPattern(src.data(), n, static_cast<uint32_t>(round));
    conn.write(dst, kDataOffset, LocalRef{src.data(), src.size(), MemoryKind::Host, nullptr}, 0, n);
    conn.updateAndSync(dst, kCounterOffset, round);
  }
}

// Returns the first bad round, or 0.
uint64_t readerRounds(Transport& t, char* data, uint64_t rounds) {
  for (uint64_t round = 1; round <= rounds; ++round) {
    if (!waitWord(t, data, kCounterOffset, round)) return round;
    const size_t n = roundBytes(round);
    if (checkPattern(data + kDataOffset, n, static_cast<uint32_t>(round)) != n) return round;
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
    fillPattern(src.data(), src.size(), 9);
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
  BOOST_TEST(checkPattern(user.data() + 1, 1, 9) == 1u);
  // The second write took src + 7: compare against the pattern shifted by 7.
  bool ok = true;
  for (size_t i = 0; i < 3 * kMiB + 1 && ok; ++i) {
    ok = static_cast<uint8_t>(user[33 + i]) == patternByte(9, i + 7);
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
    check(checkPattern(user.data() + 100, 1000, 3) == 1000, "parent's write into child");
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
    fillPattern(src.data(), src.size(), 3);
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

BOOST_AUTO_TEST_SUITE_END()
