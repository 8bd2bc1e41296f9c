// The shm transport through the plugin SDK alone (the core is not involved): registration and
// descriptors, imports in this process and in forked children (which open the parent's
// /proc/<pid>/fd), writes of 1 B to 64 MiB at odd offsets, updateAndSync ordering across
// threads and processes, user memory through process_vm_writev, corrupt descriptors, peer death,
// and leaks (stats and open fds). Children report through their exit status; they never return
// into Boost.Test.
//
// This file has the main and the cases on registration, descriptors, imports and writes;
// test_shm_sync_and_user_memory.cpp and test_shm_faults.cpp have the others (all in suite `shm`,
// run in the order of the files); shm_fixtures.hpp what they share.

#define BOOST_TEST_MODULE shm_transport
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/transport/shm/shm_fixtures.hpp"

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
  fillPattern(src.data(), src.size(), 5);
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
      fillPattern(src.data() + srcOffset, sizes[i], static_cast<uint32_t>(i + 1));
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
        checkPattern(buf.data() + offsets[i], sizes[i], static_cast<uint32_t>(i + 1)) == sizes[i],
        "write " << i << " of " << sizes[i] << " bytes at " << offsets[i]);
    const char* gap = buf.data() + offsets[i] + sizes[i];
    BOOST_TEST((gap[0] == 0 && gap[1] == 0 && gap[2] == 0), "no overrun after write " << i);
  }
  BOOST_TEST(buf.data()[0] == 0);
  BOOST_TEST(buf.base[buf.offset - 1] == 0);  // nothing before the buffer either
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
