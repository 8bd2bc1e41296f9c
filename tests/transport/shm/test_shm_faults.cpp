// The shm transport, part of test_shm_transport.cpp's suite: corrupt and mismatching descriptors
// and endpoints, a peer killed (reaped or a zombie), no leaks after 100 cycles, and last a
// bandwidth report (printed, never a pass/fail check).

#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/wire.hpp"
#include "tests/transport/shm/shm_fixtures.hpp"

namespace wire = strata::wire;

BOOST_AUTO_TEST_SUITE(shm)

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
