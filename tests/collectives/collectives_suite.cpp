// The collectives suite: started N times by strata-run (or srun, or in two network namespaces);
// Boost.Test runs the same cases in the same order in every rank, on one Communicator made by a
// global fixture from the launcher's environment. Every result is compared with a reference
// computed here from the known rank-dependent inputs (coll_values.hpp). See docs/testing.md.

#define BOOST_TEST_MODULE collectives_suite
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "coll_values.hpp"
#include "tests/harness/fixtures.hpp"

using strata::testing::ReductionInputs;

namespace {

constexpr DataType kTypes[] = {
    DataType::Int8,   DataType::Uint8,   DataType::Int32,    DataType::Uint32,  DataType::Int64,
    DataType::Uint64, DataType::Float16, DataType::BFloat16, DataType::Float32, DataType::Float64};
constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max,
                             ReduceOp::Avg};
// 0, 1, small primes, and a prime past the small-message algorithms' usual thresholds.
constexpr size_t kCounts[] = {0, 1, 7, 13, 127, 131071};
constexpr size_t kLarge = size_t{4} << 20;  // 4 Mi elements

// The communicator every case uses: made once, so the cases also prove that it stays usable.
std::unique_ptr<Communicator> gComm;

struct CommFixture {
  CommFixture() { gComm = Communicator::create(); }
  ~CommFixture() { gComm.reset(); }
};
BOOST_TEST_GLOBAL_FIXTURE(CommFixture);

Communicator& comm() {
  if (!gComm) throw std::runtime_error("no communicator (the global fixture failed)");
  return *gComm;
}

// Every rank runs the same calls in the same order, so a counter is a salt that all ranks
// agree on; it makes each call's data differ from the previous one's (stale data shows).
uint64_t nextSalt() {
  static uint64_t salt = 1;
  return salt++;
}

uint64_t seedOf(uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  return ((a * 1000003 + b) * 1000003 + c) + 1;
}

enum class Mem { Malloc, Unaligned, Registered, AllocHost };

const char* memName(Mem m) {
  switch (m) {
    case Mem::Malloc:
      return "malloc";
    case Mem::Unaligned:
      return "malloc+1 element";
    case Mem::Registered:
      return "context().allocate";
    case Mem::AllocHost:
      return "allocHost";
  }
  return "?";
}

// A buffer with guard bytes before (the unaligned offset, or 16) and after it, from malloc or
// from the communicator's context. The guards prove that nothing writes outside the buffer.
class Buffer {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr uint8_t kGuardByte = 0xC3;

  Buffer(size_t bytes, Mem mem, DataType type) : bytes_(bytes) {
    offset_ = mem == Mem::Unaligned ? strata::sizeOf(type) : 16;
    size_t total = offset_ + bytes + kGuard;
    if (mem == Mem::Registered) {
      reg_ = comm().context().allocate(total);
      base_ = static_cast<uint8_t*>(reg_.data());
    } else if (mem == Mem::AllocHost) {
      shared_ = base_ = static_cast<uint8_t*>(comm().allocHost(total));
    } else {
      owned_.reset(static_cast<uint8_t*>(std::malloc(total)));
      base_ = owned_.get();
    }
    std::memset(base_, kGuardByte, offset_);
    std::memset(base_ + offset_ + bytes, kGuardByte, kGuard);
    std::memset(data(), 0xA5, bytes);  // garbage, overwritten by the inputs or the result
  }

  ~Buffer() {
    if (shared_) comm().freeHost(shared_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  uint8_t* data() const { return base_ + offset_; }
  size_t bytes() const { return bytes_; }

  bool guardsIntact() const {
    for (size_t i = 0; i < offset_; ++i) {
      if (base_[i] != kGuardByte) return false;
    }
    for (size_t i = 0; i < kGuard; ++i) {
      if (base_[offset_ + bytes_ + i] != kGuardByte) return false;
    }
    return true;
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  size_t bytes_;
  size_t offset_ = 0;
  std::unique_ptr<uint8_t, Free> owned_;
  RegisteredMemory reg_;
  uint8_t* shared_ = nullptr;  ///< allocHost memory, freed with freeHost
  uint8_t* base_ = nullptr;
};

uint64_t fnv1a(const void* data, size_t bytes, uint64_t h = 0xCBF29CE484222325ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}

// allGathers h through the bootstrap: every rank must hold the same value.
void checkSameOnAllRanks(uint64_t h, const std::string& what) {
  auto& bs = comm().bootstrap();
  std::vector<uint64_t> all(comm().size());
  all[comm().rank()] = h;
  bs.allGather(all.data(), sizeof(uint64_t));
  for (int r = 0; r < comm().size(); ++r) {
    BOOST_TEST(all[r] == all[0], what << ": rank " << r << "'s result bytes differ from rank 0's"
                                      << " (the results must be bit-identical on every rank)");
  }
}

std::string describeCall(const char* opName, DataType type, size_t count, bool inPlace, Mem mem,
                         const char* redop = nullptr, int root = -1) {
  std::ostringstream os;
  os << opName << " " << strata::toString(type);
  if (redop) os << " " << redop;
  os << " count " << count << " N " << comm().size() << (inPlace ? " in-place" : " out-of-place")
     << " " << memName(mem);
  if (root >= 0) os << " root " << root;
  return os.str();
}

// Compares count elements of got (global indices first..) with the reference; reports the
// first mismatch and the number of wrong elements.
void checkReduced(const ReductionInputs& in, DataType type, const void* got, size_t first,
                  size_t count, const std::string& what) {
  size_t wrong = 0, firstWrong = 0;
  double gotFirst = 0;
  for (size_t i = 0; i < count; ++i) {
    double v = strata::testing::loadValue(type, got, i);
    if (!in.matches(first + i, v)) {
      if (wrong++ == 0) {
        firstWrong = i;
        gotFirst = v;
      }
    }
  }
  BOOST_TEST(wrong == 0u, what << ": " << wrong << " wrong elements; first at " << firstWrong
                               << ": got " << gotFirst << ", want "
                               << in.expected(first + firstWrong));
}

// --- the ops, one call each, checked -------------------------------------------------------

// Returns the hash of the result bytes (for the cross-rank identity check).
uint64_t runAllReduce(DataType type, ReduceOp op, size_t count, bool inPlace, Mem sendMem,
                      Mem recvMem) {
  auto& c = comm();
  std::string what = describeCall("allReduce", type, count, inPlace, sendMem,
                                  std::string(strata::toString(op)).c_str());
  if (!inPlace && sendMem != recvMem) what += std::string(" -> ") + memName(recvMem);
  ReductionInputs in(type, op, c.size(), nextSalt());
  size_t bytes = count * strata::sizeOf(type);
  Buffer send(bytes, sendMem, type);
  std::unique_ptr<Buffer> recvOwned;
  if (!inPlace) recvOwned = std::make_unique<Buffer>(bytes, recvMem, type);
  Buffer& recv = inPlace ? send : *recvOwned;
  in.fill(c.rank(), send.data(), 0, count);
  std::vector<uint8_t> sent(send.data(), send.data() + bytes);
  c.allReduce(send.data(), recv.data(), count, type, op);
  BOOST_TEST(send.guardsIntact(), what << ": wrote outside the send buffer");
  BOOST_TEST(recv.guardsIntact(), what << ": wrote outside the recv buffer");
  if (!inPlace) {
    BOOST_TEST((bytes == 0 || std::memcmp(send.data(), sent.data(), bytes) == 0),
               what << ": the send buffer changed");
  }
  checkReduced(in, type, recv.data(), 0, count, what);
  return fnv1a(recv.data(), bytes);
}

// Each rank gets a different block, so there is no cross-rank identity to check.
void runReduceScatter(DataType type, ReduceOp op, size_t recvCount, bool inPlace, Mem mem) {
  auto& c = comm();
  const int n = c.size(), me = c.rank();
  std::string what = describeCall("reduceScatter", type, recvCount, inPlace, mem,
                                  std::string(strata::toString(op)).c_str());
  ReductionInputs in(type, op, n, nextSalt());
  size_t es = strata::sizeOf(type);
  size_t sendCount = recvCount * n;
  Buffer send(sendCount * es, mem, type);
  std::unique_ptr<Buffer> recvOwned;
  if (!inPlace) recvOwned = std::make_unique<Buffer>(recvCount * es, mem, type);
  in.fill(me, send.data(), 0, sendCount);
  std::vector<uint8_t> sent(send.data(), send.data() + send.bytes());
  uint8_t* recv = inPlace ? send.data() + me * recvCount * es : recvOwned->data();
  c.reduceScatter(send.data(), recv, recvCount, type, op);
  BOOST_TEST(send.guardsIntact(), what << ": wrote outside the send buffer");
  if (!inPlace) {
    BOOST_TEST(recvOwned->guardsIntact(), what << ": wrote outside the recv buffer");
    BOOST_TEST((send.bytes() == 0 || std::memcmp(send.data(), sent.data(), send.bytes()) == 0),
               what << ": the send buffer changed");
  }
  checkReduced(in, type, recv, me * recvCount, recvCount, what);
}

void runAllGather(DataType type, size_t sendCount, bool inPlace, Mem mem) {
  auto& c = comm();
  const int n = c.size(), me = c.rank();
  std::string what = describeCall("allGather", type, sendCount, inPlace, mem);
  uint64_t salt = nextSalt();
  size_t block = sendCount * strata::sizeOf(type);
  Buffer recv(block * n, mem, type);
  std::unique_ptr<Buffer> sendOwned;
  uint8_t* send;
  if (inPlace) {
    send = recv.data() + me * block;
  } else {
    sendOwned = std::make_unique<Buffer>(block, mem, type);
    send = sendOwned->data();
  }
  fillPattern(send, block, seedOf(salt, me));
  c.allGather(send, recv.data(), sendCount, type);
  BOOST_TEST(recv.guardsIntact(), what << ": wrote outside the recv buffer");
  if (!inPlace) {
    BOOST_TEST(sendOwned->guardsIntact(), what << ": wrote outside the send buffer");
    BOOST_TEST(checkPattern(send, block, seedOf(salt, me)) == block,
               what << ": the send buffer changed");
  }
  for (int r = 0; r < n; ++r) {
    size_t at = checkPattern(recv.data() + r * block, block, seedOf(salt, r));
    BOOST_TEST(at == block, what << ": block of rank " << r << " wrong from byte " << at);
  }
}

void runBroadcast(DataType type, size_t count, int root, bool inPlace, Mem mem) {
  auto& c = comm();
  std::string what = describeCall("broadcast", type, count, inPlace, mem, nullptr, root);
  uint64_t seed = seedOf(nextSalt(), root);
  size_t bytes = count * strata::sizeOf(type);
  Buffer recv(bytes, mem, type);
  std::unique_ptr<Buffer> sendOwned;
  if (!inPlace) sendOwned = std::make_unique<Buffer>(bytes, mem, type);
  uint8_t* send = inPlace ? recv.data() : sendOwned->data();
  // Non-roots' send buffers hold garbage that must not travel.
  if (c.rank() == root) fillPattern(send, bytes, seed);
  c.broadcast(send, recv.data(), count, type, root);
  BOOST_TEST(recv.guardsIntact(), what << ": wrote outside the recv buffer");
  if (!inPlace) {
    BOOST_TEST(sendOwned->guardsIntact(), what << ": wrote outside the send buffer");
    if (c.rank() == root) {
      BOOST_TEST(checkPattern(send, bytes, seed) == bytes, what << ": the send buffer changed");
    }
  }
  size_t at = checkPattern(recv.data(), bytes, seed);
  BOOST_TEST(at == bytes, what << ": wrong from byte " << at);
}

void runAllToAll(DataType type, size_t countPerRank, Mem sendMem, Mem recvMem) {
  auto& c = comm();
  const int n = c.size(), me = c.rank();
  std::string what = describeCall("allToAll", type, countPerRank, false, sendMem);
  if (sendMem != recvMem) what += std::string(" -> ") + memName(recvMem);
  uint64_t salt = nextSalt();
  size_t block = countPerRank * strata::sizeOf(type);
  Buffer send(block * n, sendMem, type);
  Buffer recv(block * n, recvMem, type);
  for (int j = 0; j < n; ++j) fillPattern(send.data() + j * block, block, seedOf(salt, me, j));
  c.allToAll(send.data(), recv.data(), countPerRank, type);
  BOOST_TEST(send.guardsIntact(), what << ": wrote outside the send buffer");
  BOOST_TEST(recv.guardsIntact(), what << ": wrote outside the recv buffer");
  for (int j = 0; j < n; ++j) {
    BOOST_TEST(checkPattern(send.data() + j * block, block, seedOf(salt, me, j)) == block,
               what << ": the send buffer changed (block " << j << ")");
    size_t at = checkPattern(recv.data() + j * block, block, seedOf(salt, j, me));
    BOOST_TEST(at == block, what << ": block from rank " << j << " wrong from byte " << at);
  }
}

// A small allReduce that must work: after a rejected call, the communicator stays usable.
void checkStillUsable(const std::string& after) {
  BOOST_TEST_INFO_SCOPE("the allReduce after " << after);
  runAllReduce(DataType::Int32, ReduceOp::Sum, 13, false, Mem::Malloc, Mem::Malloc);
}

void expectInvalid(const std::string& what, const std::function<void()>& call) {
  auto err = catchError(call);
  BOOST_TEST(err.has_value(), what << ": no error");
  if (err) {
    BOOST_TEST((err->code() == ErrorCode::InvalidArgument),
               what << ": expected InvalidArgument, got " << describe(*err));
  }
  checkStillUsable(what);
}

}  // namespace

// --- cases ---------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(identity) {
  RANK_SCOPE();
  auto& c = comm();
  BOOST_TEST(c.size() == launchEnv().size);
  BOOST_TEST(c.rank() == launchEnv().rank);
  BOOST_TEST(c.bootstrap().rank() == c.rank());
  BOOST_TEST(c.bootstrap().size() == c.size());
}

// Every type x every op x counts, out of place and in place: exact for integers and for
// Sum/Prod/Min/Max of floats (small integer inputs), a tolerance for Avg of floats; the result
// bytes of each (type, op) must be identical on every rank.
BOOST_AUTO_TEST_CASE(all_reduce) {
  RANK_SCOPE();
  for (DataType t : kTypes) {
    for (ReduceOp op : kOps) {
      uint64_t h = 0;
      for (size_t count : kCounts) {
        for (bool inPlace : {false, true}) {
          h ^= runAllReduce(t, op, count, inPlace, Mem::Malloc, Mem::Malloc) + count;
        }
      }
      // Unaligned: one element past malloc's alignment (one byte for int8).
      for (size_t count : {size_t{7}, size_t{1031}}) {
        for (bool inPlace : {false, true}) {
          h ^= runAllReduce(t, op, count, inPlace, Mem::Unaligned, Mem::Unaligned) + count;
        }
      }
      checkSameOnAllRanks(h, std::string("allReduce ") + std::string(strata::toString(t)) + " " +
                                 std::string(strata::toString(op)));
    }
  }
}

BOOST_AUTO_TEST_CASE(all_reduce_large) {
  RANK_SCOPE();
  uint64_t h = 0;
  for (bool inPlace : {false, true}) {
    h ^= runAllReduce(DataType::Float32, ReduceOp::Sum, 1000003, inPlace, Mem::Malloc, Mem::Malloc);
  }
  h ^= runAllReduce(DataType::Float32, ReduceOp::Sum, kLarge, false, Mem::Malloc, Mem::Malloc);
  h ^= runAllReduce(DataType::Float32, ReduceOp::Avg, kLarge + 1, true, Mem::Unaligned,
                    Mem::Unaligned);
  checkSameOnAllRanks(h, "allReduce large");
}

BOOST_AUTO_TEST_CASE(reduce_scatter) {
  RANK_SCOPE();
  for (DataType t : kTypes) {
    for (ReduceOp op : kOps) {
      for (size_t count : kCounts) {
        // The largest count per rank divided by N keeps the send buffer near the others' size.
        size_t rc = count > 1000 ? count / comm().size() : count;
        for (bool inPlace : {false, true}) {
          runReduceScatter(t, op, rc, inPlace, Mem::Malloc);
        }
      }
      for (bool inPlace : {false, true}) {
        runReduceScatter(t, op, 13, inPlace, Mem::Unaligned);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(reduce_scatter_large) {
  RANK_SCOPE();
  size_t rc = kLarge / comm().size() + 1;
  runReduceScatter(DataType::BFloat16, ReduceOp::Sum, rc, false, Mem::Malloc);
  runReduceScatter(DataType::Int64, ReduceOp::Max, rc, true, Mem::Malloc);
}

BOOST_AUTO_TEST_CASE(all_gather) {
  RANK_SCOPE();
  for (DataType t : kTypes) {
    for (size_t count : kCounts) {
      size_t sc = count > 1000 ? count / comm().size() : count;
      for (bool inPlace : {false, true}) runAllGather(t, sc, inPlace, Mem::Malloc);
    }
    for (bool inPlace : {false, true}) runAllGather(t, 13, inPlace, Mem::Unaligned);
  }
}

BOOST_AUTO_TEST_CASE(all_gather_large) {
  RANK_SCOPE();
  size_t sc = kLarge / comm().size() + 3;
  runAllGather(DataType::Uint64, sc, false, Mem::Malloc);
  runAllGather(DataType::Int8, sc, true, Mem::Unaligned);
}

// Every root at N <= 8; roots 0, 1 and N-1 beyond.
BOOST_AUTO_TEST_CASE(broadcast) {
  RANK_SCOPE();
  const int n = comm().size();
  std::vector<int> roots;
  for (int r = 0; r < n; ++r) {
    if (n <= 8 || r <= 1 || r == n - 1) roots.push_back(r);
  }
  for (DataType t : kTypes) {
    for (size_t count : kCounts) {
      for (int root : roots) {
        for (bool inPlace : {false, true}) runBroadcast(t, count, root, inPlace, Mem::Malloc);
      }
    }
    runBroadcast(t, 127, n - 1, false, Mem::Unaligned);
    runBroadcast(t, 127, 0, true, Mem::Unaligned);
  }
}

BOOST_AUTO_TEST_CASE(broadcast_large) {
  RANK_SCOPE();
  const int n = comm().size();
  runBroadcast(DataType::Float64, kLarge, 0, false, Mem::Malloc);
  runBroadcast(DataType::Float64, kLarge + 1, n - 1, true, Mem::Malloc);
}

BOOST_AUTO_TEST_CASE(all_to_all) {
  RANK_SCOPE();
  for (DataType t : kTypes) {
    for (size_t count : kCounts) {
      size_t c = count > 1000 ? count / comm().size() : count;
      runAllToAll(t, c, Mem::Malloc, Mem::Malloc);
    }
    runAllToAll(t, 13, Mem::Unaligned, Mem::Unaligned);
  }
}

BOOST_AUTO_TEST_CASE(all_to_all_large) {
  RANK_SCOPE();
  runAllToAll(DataType::Int32, kLarge / comm().size() + 1, Mem::Malloc, Mem::Malloc);
}

// Auto's measured choice (collectives.measure_calls; collectives/host/measured_choice.hpp):
// within 16 KiB-4 MiB per rank the first calls of each op and size class run the slots, the
// next ones single copy, every rank times them, and on the call that completes the class the
// ranks agree on one way. Enough calls of each reading op at sizes in three classes (and one
// in-place) to finish measuring them with the default 8 calls per way: every result is
// checked, and every rank must have run the same algorithm on every call (whichever was
// faster here), also on the calls right after a decision.
BOOST_AUTO_TEST_CASE(measured_choice_agrees) {
  RANK_SCOPE();
  auto& c = comm();
  const int n = c.size();
  constexpr int kCalls = 24;  // 4 warm-ups + 2 x 8 timed calls, then 4 decided ones
  auto sameAlgorithm = [&](const std::string& what, int call) {
    const std::string name = c.lastAlgorithm();
    checkSameOnAllRanks(fnv1a(name.data(), name.size()),
                        what + " call " + std::to_string(call) + " (algorithm " + name + ")");
  };
  for (size_t bytes : {size_t{24} << 10, size_t{100} << 10, size_t{300} << 10}) {
    const size_t count = bytes / 4;
    for (int call = 0; call < kCalls; ++call) {
      runAllReduce(DataType::Float32, ReduceOp::Sum, count, call % 5 == 4, Mem::Malloc,
                   Mem::Malloc);
      sameAlgorithm("allReduce " + std::to_string(bytes), call);
      runAllGather(DataType::Int32, count, false, Mem::Malloc);
      sameAlgorithm("allGather " + std::to_string(bytes), call);
      runReduceScatter(DataType::Float32, ReduceOp::Sum, count, false, Mem::Malloc);
      sameAlgorithm("reduceScatter " + std::to_string(bytes), call);
      runBroadcast(DataType::Uint8, bytes, call % n, false, Mem::Malloc);
      sameAlgorithm("broadcast " + std::to_string(bytes), call);
      runAllToAll(DataType::Int32, count, Mem::Malloc, Mem::Malloc);
      sameAlgorithm("allToAll " + std::to_string(bytes), call);
    }
  }
}

// Memory from the communicator's own allocator, which the collectives may use without staging,
// alone and mixed with malloc'ed memory.
BOOST_AUTO_TEST_CASE(registered_memory) {
  RANK_SCOPE();
  const int n = comm().size();
  uint64_t h = 0;
  for (size_t count : {size_t{127}, size_t{131071}}) {
    for (bool inPlace : {false, true}) {
      h ^= runAllReduce(DataType::Float32, ReduceOp::Sum, count, inPlace, Mem::Registered,
                        Mem::Registered);
    }
    h ^= runAllReduce(DataType::Int32, ReduceOp::Max, count, false, Mem::Malloc, Mem::Registered);
    h ^= runAllReduce(DataType::Float16, ReduceOp::Sum, count, false, Mem::Registered, Mem::Malloc);
    for (bool inPlace : {false, true}) {
      size_t per = count > 1000 ? count / n : count;
      runReduceScatter(DataType::Float64, ReduceOp::Min, per, inPlace, Mem::Registered);
      runAllGather(DataType::Int8, per, inPlace, Mem::Registered);
      runBroadcast(DataType::Uint32, count, n - 1, inPlace, Mem::Registered);
    }
    size_t per = count > 1000 ? count / n : count;
    runAllToAll(DataType::BFloat16, per, Mem::Registered, Mem::Registered);
    runAllToAll(DataType::Uint64, per, Mem::Malloc, Mem::Registered);
  }
  h ^= runAllReduce(DataType::Float32, ReduceOp::Sum, kLarge, true, Mem::Registered,
                    Mem::Registered);
  checkSameOnAllRanks(h, "registered memory");
}

// Communicator::allocHost memory, which the zerocopy algorithm reads in place through shared
// mappings (with collectives.zero_copy_min_bytes = 1 from every size; with the default from
// 1 MiB per rank): every op, in and out of place, small and large; a call where one rank's
// buffers are malloc'ed (every rank must fall back alike); and buffers freed and allocated
// again between calls, so that an address the allocator hands out again must never be read
// through a stale mapping (more allocations than a peer keeps mapped).
BOOST_AUTO_TEST_CASE(alloc_host) {
  RANK_SCOPE();
  const int n = comm().size();
  const Mem shared = Mem::AllocHost;
  uint64_t h = 0;
  for (size_t count : {size_t{13}, size_t{131071}, size_t{1} << 20}) {
    const size_t per = count > 1000 ? count / n + 1 : count;
    for (bool inPlace : {false, true}) {
      h ^= runAllReduce(DataType::Float32, ReduceOp::Sum, count, inPlace, shared, shared);
      runReduceScatter(DataType::Int32, ReduceOp::Max, per, inPlace, shared);
      runAllGather(DataType::Uint8, per, inPlace, shared);
      runBroadcast(DataType::Float64, count, n - 1, inPlace, shared);
    }
    h ^= runAllReduce(DataType::BFloat16, ReduceOp::Avg, count, false, shared, shared);
    h ^= runAllReduce(DataType::Int64, ReduceOp::Min, count, false, Mem::Malloc, shared);
    runAllToAll(DataType::Float16, per, shared, shared);
    runAllToAll(DataType::Int8, per, shared, Mem::Malloc);
    // Rank 0's buffers are not shared: every rank must take the same fallback.
    const Mem mixed = comm().rank() == 0 ? Mem::Malloc : shared;
    h ^= runAllReduce(DataType::Float32, ReduceOp::Sum, count, false, mixed, mixed);
    runAllGather(DataType::Int32, per, false, mixed);
    runReduceScatter(DataType::Float32, ReduceOp::Sum, per, true, mixed);
    runBroadcast(DataType::Uint8, count, 0, false, mixed);
    runAllToAll(DataType::Uint64, per, mixed, mixed);
  }
  // Free and allocate again (the same addresses come back) more often than a peer keeps
  // mappings, with sizes that change; each call must see its own data.
  for (int i = 0; i < 40; ++i) {
    const size_t count = (size_t{1} << 16) + static_cast<size_t>(i % 5) * 4099;
    h ^= runAllReduce(DataType::Int32, ReduceOp::Sum, count, i % 2 == 0, shared, shared);
    runAllGather(DataType::Uint8, count, i % 3 == 0, shared);
  }
  checkSameOnAllRanks(h, "allocHost memory");
}

// allocHost and freeHost: the errors users can make.
BOOST_AUTO_TEST_CASE(alloc_host_errors) {
  RANK_SCOPE();
  auto& c = comm();
  auto err = catchError([&] { c.allocHost(0); });
  BOOST_TEST((err && err->code() == ErrorCode::InvalidArgument), "allocHost(0)");
  void* p = c.allocHost(100);
  BOOST_TEST((reinterpret_cast<uintptr_t>(p) % 4096 == 0), "allocHost is page aligned");
  std::memset(p, 1, 4096);  // rounded up to whole pages
  err = catchError([&] { c.freeHost(static_cast<char*>(p) + 8); });
  BOOST_TEST((err && err->code() == ErrorCode::InvalidArgument), "freeHost inside");
  int onStack = 0;
  err = catchError([&] { c.freeHost(&onStack); });
  BOOST_TEST((err && err->code() == ErrorCode::InvalidArgument), "freeHost of other memory");
  c.freeHost(p);
  err = catchError([&] { c.freeHost(p); });
  BOOST_TEST((err && err->code() == ErrorCode::InvalidArgument), "freeHost twice");
  c.freeHost(nullptr);
  checkStillUsable("allocHost errors");
}

// Point to point around the ring (rank -> rank+1). Rank 0 sends first, everyone else receives
// first, so the ring completes even when send blocks until the peer receives.
BOOST_AUTO_TEST_CASE(send_recv_ring) {
  RANK_SCOPE();
  auto& c = comm();
  const int n = c.size(), me = c.rank();
  REQUIRE_RANKS(2);
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  auto one = [&](DataType t, size_t count, Mem mem) {
    std::string what = describeCall("send/recv ring", t, count, false, mem);
    uint64_t salt = nextSalt();
    size_t bytes = count * strata::sizeOf(t);
    Buffer send(bytes, mem, t), recv(bytes, mem, t);
    fillPattern(send.data(), bytes, seedOf(salt, me));
    if (me == 0) {
      c.send(send.data(), count, t, next);
      c.recv(recv.data(), count, t, prev);
    } else {
      c.recv(recv.data(), count, t, prev);
      c.send(send.data(), count, t, next);
    }
    BOOST_TEST(send.guardsIntact(), what << ": wrote outside the send buffer");
    BOOST_TEST(recv.guardsIntact(), what << ": wrote outside the recv buffer");
    BOOST_TEST(checkPattern(send.data(), bytes, seedOf(salt, me)) == bytes,
               what << ": the send buffer changed");
    size_t at = checkPattern(recv.data(), bytes, seedOf(salt, prev));
    BOOST_TEST(at == bytes, what << ": data from rank " << prev << " wrong from byte " << at);
  };
  for (DataType t : kTypes) {
    for (size_t count : kCounts) one(t, count, Mem::Malloc);
    one(t, 13, Mem::Unaligned);
  }
  one(DataType::Float32, 131071, Mem::Registered);
  one(DataType::Float16, kLarge, Mem::Malloc);
}

// Pairs (2k, 2k+1) exchange with even/odd ordering; an odd rank count leaves the last rank out.
BOOST_AUTO_TEST_CASE(send_recv_pairs) {
  RANK_SCOPE();
  auto& c = comm();
  const int me = c.rank(), partner = me ^ 1;
  if (partner >= c.size()) {
    BOOST_TEST_MESSAGE("skipped: no partner for rank " << me);
    return;
  }
  for (DataType t : kTypes) {
    for (size_t count : kCounts) {
      std::string what = describeCall("send/recv pair", t, count, false, Mem::Malloc);
      size_t bytes = count * strata::sizeOf(t);
      Buffer send(bytes, Mem::Malloc, t), recv(bytes, Mem::Malloc, t);
      // A local salt: ranks left out skip this case, so the shared counter must not move.
      uint64_t salt = seedOf(0xBA5E, static_cast<uint64_t>(t), count);
      fillPattern(send.data(), bytes, seedOf(salt, me));
      if (me % 2 == 0) {
        c.send(send.data(), count, t, partner);
        c.recv(recv.data(), count, t, partner);
      } else {
        c.recv(recv.data(), count, t, partner);
        c.send(send.data(), count, t, partner);
      }
      BOOST_TEST(recv.guardsIntact(), what << ": wrote outside the recv buffer");
      size_t at = checkPattern(recv.data(), bytes, seedOf(salt, partner));
      BOOST_TEST(at == bytes, what << ": data from rank " << partner << " wrong from byte " << at);
    }
  }
}

// Messages to one peer arrive in the order sent: the sender posts 24 messages of mixed sizes
// (small ones right after large ones, where a fast path could overtake) before the receiver,
// who starts late, takes them.
BOOST_AUTO_TEST_CASE(send_recv_order) {
  RANK_SCOPE();
  auto& c = comm();
  const int me = c.rank(), partner = me ^ 1;
  if (partner >= c.size()) {
    BOOST_TEST_MESSAGE("skipped: no partner for rank " << me);
    return;
  }
  const size_t sizes[] = {1, 1000, 3, (size_t{1} << 20) + 3, 0, 7, 65537, 2, 4099, 1, 300007, 5};
  const uint64_t salt = 0x0DE5;  // not nextSalt(): ranks left out skip this case
  for (int round = 0; round < 2; ++round) {
    const bool sender = (me % 2) == round;
    std::vector<std::unique_ptr<Buffer>> bufs;
    for (int k = 0; k < 24; ++k) {
      size_t count = sizes[k % std::size(sizes)];
      bufs.push_back(std::make_unique<Buffer>(count * 4, Mem::Malloc, DataType::Float32));
      if (sender) fillPattern(bufs.back()->data(), count * 4, seedOf(salt, round, k));
    }
    if (sender) {
      for (int k = 0; k < 24; ++k) {
        c.send(bufs[k]->data(), sizes[k % std::size(sizes)], DataType::Float32, partner);
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      for (int k = 0; k < 24; ++k) {
        size_t count = sizes[k % std::size(sizes)];
        c.recv(bufs[k]->data(), count, DataType::Float32, partner);
        size_t at = checkPattern(bufs[k]->data(), count * 4, seedOf(salt, round, k));
        BOOST_TEST(at == count * 4, "message " << k << " (" << count << " floats) from rank "
                                               << partner << " wrong from byte " << at
                                               << " (out of order?)");
        BOOST_TEST(bufs[k]->guardsIntact(), "message " << k << ": wrote outside the buffer");
      }
    }
  }
}

// sendRecv: every rank sends two messages to each peer (sizes from nothing to kLarge bytes,
// different per pair and direction) and receives the peers', its items in an order of its own
// (receives first on some ranks): the batch completes and every message lands.
BOOST_AUTO_TEST_CASE(send_recv_batch) {
  RANK_SCOPE();
  auto& c = comm();
  const int n = c.size(), me = c.rank();
  REQUIRE_RANKS(2);
  const size_t sizes[] = {0, 1, 4093, 65536, 1 << 20, kLarge};
  for (int round = 0; round < 3; ++round) {
    const uint64_t salt = nextSalt();
    auto bytesOf = [&](int from, int to, int m) {
      return sizes[(from * 7 + to * 3 + m + round) % std::size(sizes)];
    };
    std::vector<std::unique_ptr<Buffer>> bufs;
    std::vector<strata::PointToPoint> items;
    std::vector<std::tuple<int, int, Buffer*>> expect;  // from, message, buffer
    for (int q = 0; q < n; ++q) {
      if (q == me) continue;
      for (int m = 0; m < 2; ++m) {
        size_t b = bytesOf(me, q, m);
        bufs.push_back(std::make_unique<Buffer>(b, Mem::Malloc, DataType::Uint8));
        fillPattern(bufs.back()->data(), b, seedOf(salt, me * 1000 + q, m));
        items.push_back(strata::PointToPoint::sendTo(bufs.back()->data(), b, DataType::Uint8, q));
        b = bytesOf(q, me, m);
        bufs.push_back(std::make_unique<Buffer>(b, Mem::Malloc, DataType::Uint8));
        items.push_back(strata::PointToPoint::recvFrom(bufs.back()->data(), b, DataType::Uint8, q));
        expect.emplace_back(q, m, bufs.back().get());
      }
    }
    // Receives before sends on odd ranks (and in reverse peer order on round 1).
    std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& b) {
      const bool ra = a.kind == strata::PointToPoint::Kind::Recv;
      const bool rb = b.kind == strata::PointToPoint::Kind::Recv;
      if (ra != rb) return (me % 2 == 1) ? ra : rb;
      return round == 1 && a.peer > b.peer;
    });
    c.sendRecv(items);
    for (auto& [from, m, buf] : expect) {
      const size_t b = bytesOf(from, me, m);
      size_t at = checkPattern(buf->data(), b, seedOf(salt, from * 1000 + me, m));
      BOOST_TEST(at == b, "batch round " << round << ": message " << m << " from rank " << from
                                         << " (" << b << " B) wrong from byte " << at);
      BOOST_TEST(buf->guardsIntact(), "batch: wrote outside a receive buffer");
    }
  }
  checkStillUsable("sendRecv");
  // Bad items: every rank the same, so every rank throws before anything moves.
  std::vector<float> a(8, 1.0f);
  const int next = (me + 1) % n;
  using P = strata::PointToPoint;
  auto batchOf = [&](P p) { return [&c, p] { c.sendRecv(std::span<const P>(&p, 1)); }; };
  expectInvalid("sendRecv to self", batchOf(P::sendTo(a.data(), 8, DataType::Float32, me)));
  expectInvalid("sendRecv to N", batchOf(P::sendTo(a.data(), 8, DataType::Float32, n)));
  expectInvalid("sendRecv from -1", batchOf(P::recvFrom(a.data(), 8, DataType::Float32, -1)));
  expectInvalid("sendRecv null send", batchOf(P::sendTo(nullptr, 8, DataType::Float32, next)));
  expectInvalid("sendRecv bad type",
                batchOf(P::sendTo(a.data(), 8, static_cast<DataType>(99), next)));
  P bad = P::sendTo(a.data(), 8, DataType::Float32, next);
  bad.kind = static_cast<P::Kind>(7);
  expectInvalid("sendRecv bad kind", batchOf(bad));
  BOOST_TEST(!catchError([&] { c.sendRecv({}); }).has_value(), "an empty batch");
  BOOST_TEST(!catchError(batchOf(P::sendTo(nullptr, 0, DataType::Float32, next))).has_value(),
             "a batch of empty items");
}

// Bad arguments: the same on every rank, so every rank throws before anything is sent and no
// rank hangs; after each, the communicator still works.
BOOST_AUTO_TEST_CASE(bad_arguments) {
  RANK_SCOPE();
  auto& c = comm();
  const int n = c.size(), me = c.rank();
  const DataType f = DataType::Float32;
  const ReduceOp sum = ReduceOp::Sum;
  std::vector<float> a(64 * n, 1.0f), b(64 * n, 0.0f);

  // Null with count 0 is fine everywhere.
  BOOST_TEST(!catchError([&] { c.allReduce(nullptr, nullptr, 0, f, sum); }).has_value());
  BOOST_TEST(!catchError([&] { c.allGather(nullptr, nullptr, 0, f); }).has_value());
  BOOST_TEST(!catchError([&] { c.reduceScatter(nullptr, nullptr, 0, f, sum); }).has_value());
  BOOST_TEST(!catchError([&] { c.broadcast(nullptr, nullptr, 0, f, 0); }).has_value());
  BOOST_TEST(!catchError([&] { c.allToAll(nullptr, nullptr, 0, f); }).has_value());
  checkStillUsable("null buffers with count 0");

  expectInvalid("allReduce null send", [&] { c.allReduce(nullptr, b.data(), 8, f, sum); });
  expectInvalid("allReduce null recv", [&] { c.allReduce(a.data(), nullptr, 8, f, sum); });
  expectInvalid("allGather null send", [&] { c.allGather(nullptr, b.data(), 8, f); });
  expectInvalid("allGather null recv", [&] { c.allGather(a.data(), nullptr, 8, f); });
  expectInvalid("reduceScatter null send", [&] { c.reduceScatter(nullptr, b.data(), 8, f, sum); });
  expectInvalid("reduceScatter null recv", [&] { c.reduceScatter(a.data(), nullptr, 8, f, sum); });
  expectInvalid("broadcast null recv", [&] { c.broadcast(a.data(), nullptr, 8, f, 0); });
  expectInvalid("allToAll null send", [&] { c.allToAll(nullptr, b.data(), 8, f); });
  expectInvalid("allToAll null recv", [&] { c.allToAll(a.data(), nullptr, 8, f); });
  expectInvalid("send null", [&] { c.send(nullptr, 8, f, (me + 1) % n); });
  expectInvalid("recv null", [&] { c.recv(nullptr, 8, f, (me + 1) % n); });

  expectInvalid("broadcast root -1", [&] { c.broadcast(a.data(), b.data(), 8, f, -1); });
  expectInvalid("broadcast root N", [&] { c.broadcast(a.data(), b.data(), 8, f, n); });
  expectInvalid("send to -1", [&] { c.send(a.data(), 8, f, -1); });
  expectInvalid("send to N", [&] { c.send(a.data(), 8, f, n); });
  expectInvalid("send to self", [&] { c.send(a.data(), 8, f, me); });
  expectInvalid("recv from -1", [&] { c.recv(b.data(), 8, f, -1); });
  expectInvalid("recv from N", [&] { c.recv(b.data(), 8, f, n); });
  expectInvalid("recv from self", [&] { c.recv(b.data(), 8, f, me); });

  // Overlaps that are not the in-place case.
  expectInvalid("allReduce recv = send + 1",
                [&] { c.allReduce(a.data(), a.data() + 1, 8, f, sum); });
  expectInvalid("allReduce recv = send - 1",
                [&] { c.allReduce(a.data() + 1, a.data(), 8, f, sum); });
  // Only the root reads send (NCCL: non-roots ignore it), so only a root can reject an
  // overlap; all ranks throw only when every rank is the root.
  if (n == 1) {
    expectInvalid("broadcast recv = send + 1",
                  [&] { c.broadcast(a.data(), a.data() + 1, 8, f, 0); });
  }
  // In place is send == recv + rank * 4; recv = send + 1 never is.
  expectInvalid("allGather recv = send + 1", [&] { c.allGather(a.data(), a.data() + 1, 4, f); });
  // In place is recv == send + rank * 4; one element further is not.
  expectInvalid("reduceScatter recv = send + rank * 4 + 1",
                [&] { c.reduceScatter(a.data(), a.data() + me * 4 + 1, 4, f, sum); });
  expectInvalid("allToAll send == recv", [&] { c.allToAll(a.data(), a.data(), 4, f); });
  expectInvalid("allToAll recv = send + 1", [&] { c.allToAll(a.data(), a.data() + 1, 4, f); });
}

// 200 back-to-back small allReduces of changing sizes and types, nothing in between: catches
// lost or stale signals and scratch reused before the peers are done with it.
BOOST_AUTO_TEST_CASE(sequence) {
  RANK_SCOPE();
  const DataType types[] = {DataType::Float32, DataType::Int32, DataType::Float16, DataType::Int8,
                            DataType::Float64};
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Sum, ReduceOp::Min};
  uint64_t h = 0;
  for (int k = 0; k < 200; ++k) {
    size_t count = (static_cast<size_t>(k) * 7919) % 5003 + (k % 3 == 0 ? 0 : 1);
    if (k % 17 == 0) count = 0;
    h ^= runAllReduce(types[k % 5], ops[k % 4], count, k % 2 == 1, Mem::Malloc, Mem::Malloc);
  }
  checkSameOnAllRanks(h, "sequence");
}

// Every op back to back, 30 rounds: scratch or signals left over from one op must not disturb
// the next.
BOOST_AUTO_TEST_CASE(mixed_sequence) {
  RANK_SCOPE();
  const int n = comm().size();
  for (int k = 0; k < 30; ++k) {
    size_t count = 1 + (static_cast<size_t>(k) * 389) % 3001;
    runAllReduce(DataType::Float32, ReduceOp::Sum, count, false, Mem::Malloc, Mem::Malloc);
    runAllGather(DataType::Int32, count, k % 2 == 0, Mem::Malloc);
    runReduceScatter(DataType::Int64, ReduceOp::Sum, count, k % 2 == 1, Mem::Malloc);
    runBroadcast(DataType::Uint8, count, k % n, false, Mem::Malloc);
    runAllToAll(DataType::Float16, count, Mem::Malloc, Mem::Malloc);
  }
}

int main(int argc, char** argv) {
  return strata::testing::multiProcessMain(
      argc, argv, "collectives_suite: needs a launcher (strata-run -n N, srun, mpirun)",
      [] { return true; });
}
