// One rank of the stalled-job tests (tests/stress/stall.sh, issue 16): the script stops one rank
// with SIGSTOP (or makes one rank call another collective) and checks that every rank's error
// names the rank at fault first. The ranks tell the script where they are through files in DIR,
// so that nothing depends on a sleep.
//
// usage: stall DIR MODE [COUNT]
//   Before anything else the rank writes DIR/pid.R (its pid). Then, by MODE:
//   allreduce  Communicator::create, then allReduce of COUNT floats (default 1024) in a loop;
//              after the first call it writes DIR/at.R. With env STALL_HOLD=H, rank H then
//              waits for DIR/go.H, the others for DIR/go.all, before their next call.
//   allgather  Bootstrap::create, then Bootstrap::allGather of COUNT bytes per rank (default 64)
//              in a loop; DIR/at.R after the first.
//   flush      Bootstrap, Context and one Connection to every peer (the transport of
//              transport.intra_node), a ProxyService (flush timeout: transport.timeout) with one
//              PortChannel to every peer; in a loop, a put of COUNT bytes (default 256 KiB) to
//              every peer, then a flush of every channel; DIR/at.R after the first round.
//   mismatch   Communicator::create, two allReduces, then the rank named by env STALL_ODD
//              (default 3) calls broadcast (root 0) while the others call allReduce (#3 both).
//   missing    Communicator::create, then the rank named by env STALL_ODD (default 3) enters a
//              bootstrap barrier while the others call allReduce; they join the barrier after
//              their error. DIR/at.R just before.
//   idle       Communicator::create, two allReduces, then DIR/idle.R; waits for DIR/go (in the
//              application's own code), then one more allReduce.
// Every loop ends when DIR/end exists (then "RESULT ok"). A strata error prints
//   "stall: rank R: RESULT FAILED code=CODE peer=P at=EPOCH call=WHAT msg: MESSAGE"
// (EPOCH: the wall-clock time the error was caught, in seconds) at once, before the objects are
// destroyed, and exits 3. A wait for a file that never comes (120 s) exits 4.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <strata/bootstrap.hpp>
#include <strata/channel.hpp>
#include <strata/communicator.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>
#include <strata/transport.hpp>

#include "tests/harness/marker_files.hpp"

namespace {

std::string dir;
int rank = -1;
std::string where = "create";

bool exists(const std::string& name) {
  return strata::test::markerExists(dir, name);
}

void touch(const std::string& name, const std::string& text = "") {
  strata::test::writeMarker(dir, name, text, "stall");
}

void waitFor(const std::string& name) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!exists(name)) {
    if (std::chrono::steady_clock::now() > until) {
      std::fprintf(stderr, "stall: rank %d: %s never appeared\n", rank, name.c_str());
      std::exit(4);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

double epoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

[[noreturn]] void failed(const strata::Error& e) {
  // At once: the script measures the time from the stop to this line.
  const double at = epoch();
  std::string msg = e.what();
  for (char& c : msg) {
    if (c == '\n') c = ' ';
  }
  std::printf("stall: rank %d: RESULT FAILED code=%s peer=%d at=%.3f call=%s msg: %s\n", rank,
              std::string(strata::toString(e.code())).c_str(), e.peer(), at, where.c_str(),
              msg.c_str());
  std::fflush(stdout);
  throw e;  // the caller's objects are destroyed as in an application that gives up
}

void ok() {
  std::printf("stall: rank %d: RESULT ok\n", rank);
  std::fflush(stdout);
}

int runAllReduce(size_t count) {
  auto comm = strata::Communicator::create();
  rank = comm->rank();
  const char* h = std::getenv("STALL_HOLD");
  const int hold = h ? std::atoi(h) : -1;
  std::vector<float> send(count, 1.0f), recv(count);
  for (uint64_t i = 1;; ++i) {
    where = "allReduce #" + std::to_string(i);
    try {
      comm->allReduce(send.data(), recv.data(), count, strata::DataType::Float32,
                      strata::ReduceOp::Sum);
    } catch (const strata::Error& e) {
      failed(e);
    }
    if (recv[0] != static_cast<float>(comm->size())) {
      std::fprintf(stderr, "stall: rank %d: allReduce #%llu: %g, expected %d\n", rank,
                   static_cast<unsigned long long>(i), recv[0], comm->size());
      return 1;
    }
    if (i == 1) {
      touch("at." + std::to_string(rank));
      if (hold >= 0) waitFor(rank == hold ? "go." + std::to_string(rank) : std::string("go.all"));
    }
    if (exists("end")) break;
  }
  ok();
  return 0;
}

int runAllGather(size_t bytes) {
  auto boot = strata::Bootstrap::create();
  rank = boot->rank();
  std::vector<uint8_t> buf(bytes * static_cast<size_t>(boot->size()));
  for (uint64_t i = 1;; ++i) {
    where = "bootstrap allGather #" + std::to_string(i);
    std::memset(buf.data() + bytes * static_cast<size_t>(rank), rank + 1, bytes);
    try {
      boot->allGather(buf.data(), bytes);
    } catch (const strata::Error& e) {
      failed(e);
    }
    for (int r = 0; r < boot->size(); ++r) {
      if (buf[bytes * static_cast<size_t>(r)] != static_cast<uint8_t>(r + 1)) {
        std::fprintf(stderr, "stall: rank %d: allGather #%llu: slot %d is wrong\n", rank,
                     static_cast<unsigned long long>(i), r);
        return 1;
      }
    }
    if (i == 1) touch("at." + std::to_string(rank));
    if (exists("end")) break;
  }
  ok();
  return 0;
}

int runFlush(size_t bytes) {
  strata::Config config = strata::Config::load();
  std::shared_ptr<strata::Bootstrap> boot = strata::Bootstrap::create(config);
  rank = boot->rank();
  const int n = boot->size();
  auto ctx = strata::Context::create(boot, config);
  std::vector<int> peers;
  for (int p = 0; p < n; ++p) {
    if (p != rank) peers.push_back(p);
  }
  where = "connect";
  auto conns = ctx->connect(peers);
  // Every rank's destination holds one slot per rank; the flags hold one word per rank.
  auto src = ctx->allocate(bytes);
  auto dst = ctx->allocate(bytes * static_cast<size_t>(n));
  auto flags = ctx->allocate(8 * static_cast<size_t>(n));
  std::memset(src.data(), rank + 1, bytes);
  auto remoteDst = ctx->exchange(dst, peers);
  auto remoteFlags = ctx->exchange(flags, peers);
  const char* t = std::getenv("STRATA_TRANSPORT_TIMEOUT");
  strata::ProxyService proxy(1024, t ? std::atof(t) : 30);
  std::vector<uint32_t> ids;
  for (size_t i = 0; i < peers.size(); ++i) {
    ids.push_back(proxy.addChannel(conns[i], remoteDst[i], src, remoteFlags[i],
                                   8 * static_cast<uint64_t>(rank)));
  }
  proxy.start();
  std::vector<strata::PortChannel> ports;
  std::vector<uint64_t> consumed(peers.size(), 0);  // the channels' expected words
  for (size_t i = 0; i < peers.size(); ++i) {
    ports.push_back(proxy.portChannel(
        ids[i], static_cast<uint64_t*>(flags.data()) + static_cast<size_t>(peers[i]),
        &consumed[i]));
  }
  boot->barrier();
  for (uint64_t i = 1;; ++i) {
    where = "put+flush round " + std::to_string(i);
    for (auto& port : ports) port.put(bytes * static_cast<uint64_t>(rank), 0, bytes);
    // As a kernel would, but without spinning: 16 ranks spinning on 2 cores would starve the
    // proxy threads whose errors the test times.
    for (auto& port : ports) {
      uint64_t id = 0;
      while (!port.tryFlush(&id)) std::this_thread::sleep_for(std::chrono::microseconds(100));
      while (!port.fifo.done(id)) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    try {
      proxy.check();
    } catch (const strata::Error& e) {
      failed(e);
    }
    if (i == 1) touch("at." + std::to_string(rank));
    if (exists("end")) break;
  }
  proxy.stop();
  ok();
  return 0;
}

int runMismatch(size_t count) {
  auto comm = strata::Communicator::create();
  rank = comm->rank();
  const char* o = std::getenv("STALL_ODD");
  const int odd = o ? std::atoi(o) : 3;
  std::vector<float> send(count, 1.0f), recv(count);
  for (int i = 1; i <= 3; ++i) {
    const bool bcast = i == 3 && rank == odd;
    if (bcast) {
      // The others are in allReduce #3 (or about to be) when this rank finds the mismatch and
      // asks them: else a rank still finishing #2 would blur the picture.
      for (int p = 0; p < comm->size(); ++p) {
        if (p != rank) waitFor("at." + std::to_string(p));
      }
    }
    where = std::string(bcast ? "broadcast" : "allReduce") + " #" + std::to_string(i);
    try {
      if (bcast) {
        comm->broadcast(send.data(), recv.data(), count, strata::DataType::Float32, 0);
      } else {
        comm->allReduce(send.data(), recv.data(), count, strata::DataType::Float32,
                        strata::ReduceOp::Sum);
      }
    } catch (const strata::Error& e) {
      failed(e);
    }
    if (i == 2) touch("at." + std::to_string(rank));
  }
  // The mismatched call must not succeed.
  std::printf("stall: rank %d: RESULT ok (the mismatched call did not fail)\n", rank);
  return 1;
}

int runMissing(size_t count) {
  auto comm = strata::Communicator::create();
  rank = comm->rank();
  const char* o = std::getenv("STALL_ODD");
  const int odd = o ? std::atoi(o) : 3;
  std::vector<float> send(count, 1.0f), recv(count);
  touch("at." + std::to_string(rank));
  if (rank != odd) {
    where = "allReduce #1";
    try {
      comm->allReduce(send.data(), recv.data(), count, strata::DataType::Float32,
                      strata::ReduceOp::Sum);
      std::printf("stall: rank %d: RESULT ok (the allReduce without rank %d returned)\n", rank,
                  odd);
      return 1;
    } catch (const strata::Error& e) {
      try {
        failed(e);
      } catch (const strata::Error&) {
      }
    }
  }
  // Every rank meets here at last (the others after their error), as in an application that
  // synchronises before it exits.
  where = "bootstrap barrier";
  comm->bootstrap().barrier();
  if (rank == odd) ok();
  return rank == odd ? 0 : 3;
}

int runIdle(size_t count) {
  auto comm = strata::Communicator::create();
  rank = comm->rank();
  std::vector<float> send(count, 1.0f), recv(count);
  for (int i = 1; i <= 3; ++i) {
    where = "allReduce #" + std::to_string(i);
    if (i == 3) {
      touch("idle." + std::to_string(rank));
      waitFor("go");
    }
    try {
      comm->allReduce(send.data(), recv.data(), count, strata::DataType::Float32,
                      strata::ReduceOp::Sum);
    } catch (const strata::Error& e) {
      failed(e);
    }
  }
  ok();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s DIR allreduce|allgather|flush|mismatch|idle [COUNT]\n",
                 argv[0]);
    return 2;
  }
  dir = argv[1];
  const std::string mode = argv[2];
  const size_t count = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 0;
  const char* r = std::getenv("STRATA_RANK");
  rank = r ? std::atoi(r) : 0;
  touch("pid." + std::to_string(rank), std::to_string(::getpid()) + "\n");
  try {
    if (mode == "allreduce") return runAllReduce(count ? count : 1024);
    if (mode == "allgather") return runAllGather(count ? count : 64);
    if (mode == "flush") return runFlush(count ? count : 256 * 1024);
    if (mode == "mismatch") return runMismatch(count ? count : 1024);
    if (mode == "idle") return runIdle(count ? count : 1024);
    if (mode == "missing") return runMissing(count ? count : 1024);
    std::fprintf(stderr, "stall: unknown mode '%s'\n", mode.c_str());
    return 2;
  } catch (const strata::Error& e) {
    if (where == "create" || where == "connect") {
      std::printf("stall: rank %d: RESULT FAILED code=%s peer=%d at=%.3f call=%s msg: %s\n", rank,
                  std::string(strata::toString(e.code())).c_str(), e.peer(), epoch(), where.c_str(),
                  e.what());
    }
    return 3;
  } catch (const std::exception& e) {
    std::printf("stall: rank %d: RESULT FAILED (not a strata error) call=%s: %s\n", rank,
                where.c_str(), e.what());
    return 5;
  }
}
