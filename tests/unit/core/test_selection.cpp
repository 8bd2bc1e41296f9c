// The collectives seam in one process (a one-rank job): algorithm forcing by name and its
// errors, selection, the listing and the tuning report strata-info prints, a collectives module
// registered like a CUDA module would be, and calls no algorithm can run.

#define BOOST_TEST_MODULE algorithms
#include <boost/test/unit_test.hpp>

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "tests/harness/single_rank.hpp"

using strata::Communicator;
using strata::Config;
using strata::DataType;
using strata::Error;
using strata::ErrorCode;
using strata::ReduceOp;
using strata::testing::expectError;

namespace {

// Runs in a process without any launcher environment: a single-rank job.
using strata::testing::SingleRankEnv;
BOOST_TEST_GLOBAL_FIXTURE(SingleRankEnv);

Config base() {
  Config c;
  c.set("bootstrap.backend", "tcp");
  c.set("module.path", TEST_MODULE_DIR);
  return c;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_CASE(unknown_names_are_invalid_config_naming_the_choices) {
  Config c = base();
  c.set("collectives.algorithm", "nosuch");
  auto e = expectError([&] { Communicator::create(c); });
  BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::InvalidConfig));
  BOOST_TEST(has(e.what(), "collectives.algorithm = nosuch"));
  BOOST_TEST(has(e.what(), "twoshot"));
  BOOST_TEST(has(e.what(), "oneshot"));

  // A name that exists, but not for this op, in the per-op key.
  Config d = base();
  d.set("collectives.allgather.algorithm", "oneshot");
  e = expectError([&] { Communicator::create(d); });
  BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::InvalidConfig));
  BOOST_TEST(has(e.what(), "collectives.allgather.algorithm = oneshot"));
  BOOST_TEST(has(e.what(), "host/direct"));
  BOOST_TEST(!has(e.what(), "host/twoshot"));
}

BOOST_AUTO_TEST_CASE(the_global_key_forces_the_ops_that_have_the_name) {
  Config c = base();
  c.set("collectives.algorithm", "twoshot");
  auto comm = Communicator::create(c);
  std::vector<float> a(64, 1.0f), b(64, 0.0f);
  comm->allReduce(a.data(), b.data(), a.size(), DataType::Float32, ReduceOp::Sum);
  BOOST_TEST(comm->lastAlgorithm() == "host/twoshot");
  BOOST_TEST(b[7] == 1.0f);
  // allGather has no twoshot: it chooses automatically.
  comm->allGather(a.data(), b.data(), a.size(), DataType::Float32);
  BOOST_TEST(comm->lastAlgorithm() == "host/direct");
  bool listed = false;
  for (const auto& info : comm->algorithms()) {
    if (info.name == "twoshot") listed = info.forcedFor == std::vector<std::string>{"allReduce"};
  }
  BOOST_TEST(listed);
}

// A per-op key wins over the global one for its op; the global name still counts as known even
// when every op that has it is overridden, and "auto" per op undoes the global key.
BOOST_AUTO_TEST_CASE(per_op_keys_override_the_global_key) {
  Config c = base();
  c.set("collectives.algorithm", "twoshot");
  c.set("collectives.allreduce.algorithm", "oneshot");
  auto comm = Communicator::create(c);
  std::vector<float> a(1 << 16, 1.0f), b(1 << 16, 0.0f);
  comm->allReduce(a.data(), b.data(), a.size(), DataType::Float32, ReduceOp::Sum);
  BOOST_TEST(comm->lastAlgorithm() == "host/oneshot");

  Config d = base();
  d.set("collectives.algorithm", "singlecopy");
  d.set("collectives.allgather.algorithm", "auto");
  auto comm2 = Communicator::create(d);
  comm2->allGather(a.data(), b.data(), 16, DataType::Float32);
  BOOST_TEST(comm2->lastAlgorithm() == "host/direct");  // auto: no single copy at one rank
}

BOOST_AUTO_TEST_CASE(auto_selection_follows_the_documented_order) {
  auto comm = Communicator::create(base());
  std::vector<double> a(16, 2.0), b(16, 0.0);
  comm->allReduce(a.data(), b.data(), a.size(), DataType::Float64, ReduceOp::Sum);
  BOOST_TEST(comm->lastAlgorithm() == "host/oneshot");  // small: oneshot prefers it
  comm->broadcast(a.data(), b.data(), a.size(), DataType::Float64, 0);
  BOOST_TEST(comm->lastAlgorithm() == "host/direct");  // one rank: no single copy
  std::vector<std::string> names;
  for (const auto& info : comm->algorithms()) names.push_back(info.backend + "/" + info.name);
  std::vector<std::string> expected{"host/zerocopy",   "host/oneshot", "host/hierarchical",
                                    "host/singlecopy", "host/twoshot", "host/direct"};
  // Modules come after the built-ins: the CUDA module where it was built (collectives.modules
  // = auto loads it even without a GPU; it then serves nothing).
  if (names.size() > expected.size()) {
    for (const char* n :
         {"cuda/oneshot-ll8", "cuda/twoshot-ll16", "cuda/direct-staged", "cuda/cross-host"}) {
      expected.push_back(n);
    }
  }
  BOOST_TEST(names == expected, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_forced_algorithm_that_cannot_serve_the_call_is_not_supported) {
  Config c = base();
  c.set("collectives.allreduce.algorithm", "hierarchical");
  c.set("collectives.allgather.algorithm", "singlecopy");
  auto comm = Communicator::create(c);
  std::vector<float> a(8, 1.0f), b(8, 0.0f);
  auto e = expectError(
      [&] { comm->allReduce(a.data(), b.data(), a.size(), DataType::Float32, ReduceOp::Sum); });
  BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::NotSupported));
  BOOST_TEST(has(e.what(), "host/hierarchical"));
  BOOST_TEST(has(e.what(), "collectives.allreduce.algorithm = hierarchical"));
  BOOST_TEST(has(e.what(), "several hosts"));
  e = expectError([&] { comm->allGather(a.data(), b.data(), a.size(), DataType::Float32); });
  BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::NotSupported));
  BOOST_TEST(has(e.what(), "host/singlecopy"));
  // Selection failed before anything moved: the communicator is still usable.
  comm->broadcast(a.data(), b.data(), a.size(), DataType::Float32, 0);
  BOOST_TEST(b[3] == 1.0f);
}

// Host memory with a stream (strata::hostOrdered): without the CUDA driver in the process no
// CUDA work can be pending and the call runs as on no stream.
BOOST_AUTO_TEST_CASE(a_stream_on_host_memory_without_cuda_runs_the_call) {
  auto comm = Communicator::create(base());
  std::vector<float> a(8, 1.0f), b(8, 0.0f);
  int fakeStream = 0;
  comm->allReduce(a.data(), b.data(), a.size(), DataType::Float32, ReduceOp::Sum,
                  strata::Stream{&fakeStream});
  BOOST_TEST(b[0] == 1.0f);
  BOOST_TEST(strata::hostOrdered(a.data(), strata::Stream{&fakeStream}).handle == nullptr);
}

BOOST_AUTO_TEST_CASE(a_collectives_module_registers_like_a_built_in) {
  Config c = base();
  c.set("collectives.modules", "testcoll");
  c.set("collectives.allgather.algorithm", "testcopy");
  auto comm = Communicator::create(c);
  std::vector<int32_t> a{1, 2, 3}, b(3, 0);
  comm->allGather(a.data(), b.data(), a.size(), DataType::Int32);
  BOOST_TEST(comm->lastAlgorithm() == "testcoll/testcopy");
  BOOST_TEST(b == a, boost::test_tools::per_element());
  bool listed = false;
  for (const auto& info : comm->algorithms()) listed |= info.backend == "testcoll";
  BOOST_TEST(listed);
  // Not forced, the module's algorithm does not prefer anything: the host's runs.
  auto plain = Communicator::create([] {
    Config d = base();
    d.set("collectives.modules", "testcoll");
    return d;
  }());
  plain->allGather(a.data(), b.data(), a.size(), DataType::Int32);
  BOOST_TEST(plain->lastAlgorithm() == "host/direct");
}

BOOST_AUTO_TEST_CASE(an_asynchronous_error_is_reported_and_breaks_the_communicator) {
  Config c = base();
  c.set("collectives.modules", "testcoll");
  auto comm = Communicator::create(c);
  std::vector<int32_t> a{1, 2, 3}, b(3, 0);
  BOOST_TEST(!comm->asyncError().has_value());
  comm->allGather(a.data(), b.data(), a.size(), DataType::Int32);
  setenv("STRATA_TESTCOLL_ASYNC_ERROR", "1", 1);
  auto e = comm->asyncError();
  unsetenv("STRATA_TESTCOLL_ASYNC_ERROR");
  BOOST_REQUIRE(e.has_value());
  BOOST_TEST(static_cast<int>(e->code()) == static_cast<int>(ErrorCode::Timeout));
  BOOST_TEST(e->peer() == 0);
  // It sticks (the module no longer reports it), and the next call fails with it.
  BOOST_TEST(comm->asyncError().has_value());
  auto next = expectError([&] { comm->allGather(a.data(), b.data(), a.size(), DataType::Int32); });
  BOOST_TEST(static_cast<int>(next.code()) == static_cast<int>(ErrorCode::Timeout));
  BOOST_TEST(has(next.what(), "cannot be used"));
}

BOOST_AUTO_TEST_CASE(the_tuning_report_joins_the_backends_that_tuned_something) {
  Config c = base();
  c.set("collectives.modules", "testcoll");
  auto comm = Communicator::create(c);
  // One rank: the host backend says why nothing was measured; the module has nothing to say.
  const std::string host = comm->tuningReport();
  BOOST_TEST(host.rfind("host collectives tuning: not needed: one rank", 0) == 0);
  BOOST_TEST(has(host, "\nallReduce single copy: never (single copy is not available"));
  BOOST_TEST(has(host, "\nzero copy (allocHost buffers): not available"));
  BOOST_TEST(!has(host, "testcoll"));
  BOOST_TEST(host.back() == '\n');
  setenv("STRATA_TESTCOLL_TUNING", "testcoll tuning: fixed", 1);
  const std::string both = comm->tuningReport();
  unsetenv("STRATA_TESTCOLL_TUNING");
  BOOST_TEST(both == host + "\ntestcoll tuning: fixed\n");
}

BOOST_AUTO_TEST_CASE(a_named_module_that_is_missing_fails_at_create) {
  Config c = base();
  c.set("collectives.modules", "nosuchcoll");
  auto e = expectError([&] { Communicator::create(c); });
  BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::NotSupported));
  BOOST_TEST(has(e.what(), "strata-collectives-nosuchcoll.so"));
  // auto skips a known module that is absent (cuda here) without a word.
  Config d = base();
  d.set("collectives.modules", "auto");
  BOOST_CHECK_NO_THROW(Communicator::create(d));
}

// Enum values from outside (a C caller, a corrupt header) are checked by value, not by position
// against the last enumerator.
BOOST_AUTO_TEST_CASE(enum_checks_are_by_value) {
  BOOST_TEST(strata::isKnown(DataType::Float64));
  BOOST_TEST(strata::isKnown(DataType::Int8));
  BOOST_TEST(!strata::isKnown(static_cast<DataType>(10)));
  BOOST_TEST(!strata::isKnown(static_cast<DataType>(-1)));
  BOOST_TEST(strata::isKnown(ReduceOp::Avg));
  BOOST_TEST(!strata::isKnown(static_cast<ReduceOp>(5)));
  BOOST_TEST(!strata::isKnown(static_cast<ReduceOp>(-1)));
  auto comm = Communicator::create(base());
  std::vector<float> a(4, 1.0f), b(4);
  auto e = expectError([&] {
    comm->allReduce(a.data(), b.data(), a.size(), DataType::Float32, static_cast<ReduceOp>(-1));
  });
  BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::InvalidArgument));
  e = expectError([&] { comm->allGather(a.data(), b.data(), 1, static_cast<DataType>(42)); });
  BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::InvalidArgument));
}

// With the driver loaded (a stand-in whose cuStreamSynchronize performs the write the test
// queued on the "stream", tests/harness/fake_cuda.cpp), a call on host memory first waits for
// the stream: the allReduce sees the queued values, a call without a stream does not wait, and
// a stream that reports a failure fails the call with BackendError before anything runs. Last
// in this module: the driver stays loaded.
BOOST_AUTO_TEST_CASE(a_stream_on_host_memory_is_waited_for_where_cuda_is_loaded) {
  const char* path = std::getenv("STRATA_TEST_FAKE_CUDA");
  BOOST_TEST_REQUIRE(path != nullptr, "STRATA_TEST_FAKE_CUDA (set by meson) is missing");
  void* cuda = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  BOOST_TEST_REQUIRE(cuda != nullptr, dlerror());
  auto pending = reinterpret_cast<void (*)(float*, size_t, float)>(dlsym(cuda, "fakeCudaPending"));
  auto syncs = reinterpret_cast<int (*)()>(dlsym(cuda, "fakeCudaSyncs"));
  auto failNext = reinterpret_cast<void (*)()>(dlsym(cuda, "fakeCudaFailNext"));
  BOOST_TEST_REQUIRE((pending && syncs && failNext));
  auto comm = Communicator::create(base());
  std::vector<float> a(64, 0.0f), b(64, 0.0f);
  int fakeStream = 0;
  const strata::Stream stream{&fakeStream};
  pending(a.data(), a.size(), 5.0f);
  comm->allReduce(a.data(), b.data(), a.size(), DataType::Float32, ReduceOp::Sum, stream);
  BOOST_TEST(syncs() == 1);
  BOOST_TEST(b[0] == 5.0f);
  BOOST_TEST(b[63] == 5.0f);
  comm->allGather(a.data(), b.data(), a.size(), DataType::Float32);
  BOOST_TEST(syncs() == 1);
  comm->broadcast(a.data(), b.data(), a.size(), DataType::Float32, 0, stream);
  BOOST_TEST(syncs() == 2);
  BOOST_TEST(strata::hostOrdered(a.data(), stream).handle == nullptr);
  BOOST_TEST(syncs() == 3);
  failNext();
  auto e = expectError([&] {
    comm->allReduce(a.data(), b.data(), a.size(), DataType::Float32, ReduceOp::Sum, stream);
  });
  BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(ErrorCode::BackendError));
  BOOST_TEST(has(e.what(), "cuStreamSynchronize failed (700)"), e.what());
  comm->allReduce(a.data(), b.data(), a.size(), DataType::Float32, ReduceOp::Sum, stream);
  BOOST_TEST(syncs() == 4);
}
