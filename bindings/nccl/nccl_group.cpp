// NCCL groups over strata: ncclGroupStart/End nest; calls between them are queued and run when
// the outermost group ends. Inits of one group run at once (threads); sends and receives run as
// batches per communicator (Communicator::sendRecv) that complete whatever their order on each
// rank, and a batch that is an all-to-all runs as one allToAll.

#include <algorithm>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "nccl_internal.hpp"

#define NCCL_EXPORT extern "C" __attribute__((visibility("default")))
#define NCCL_TWIN(ret, name, params) NCCL_EXPORT ret p##name params __attribute__((alias(#name)));

namespace strata::nccl {

namespace {

struct Group {
  int depth = 0;
  std::vector<GroupOp> ops;
  std::vector<std::function<void()>> inits;
};
thread_local Group group;

bool isP2p(const GroupOp& op) {
  return op.kind == GroupOp::Send || op.kind == GroupOp::Recv;
}

/// The batch as one allToAll when it is one: exactly one send to and one receive from every
/// rank (itself too), all of one count and type, block p of one send buffer to rank p and block p
/// of one receive buffer from it.
bool asAllToAll(ncclComm* comm, const std::vector<GroupOp>& ops) {
  const size_t n = static_cast<size_t>(comm->size);
  if (ops.size() != 2 * n || n < 2) return false;
  std::vector<const GroupOp*> sends(n, nullptr), recvs(n, nullptr);
  for (const GroupOp& op : ops) {
    if (op.peer < 0 || static_cast<size_t>(op.peer) >= n) return false;
    auto& slot = op.kind == GroupOp::Send ? sends[op.peer] : recvs[op.peer];
    if (slot != nullptr || op.count != ops[0].count || op.type != ops[0].type ||
        op.stream != ops[0].stream) {
      return false;
    }
    slot = &op;
  }
  const size_t bytes = ops[0].count * sizeOf(ops[0].type);
  if (bytes == 0) return false;
  const char* sendBase = static_cast<const char*>(sends[0]->sendBuf);
  char* recvBase = static_cast<char*>(recvs[0]->recvBuf);
  for (size_t p = 0; p < n; ++p) {
    if (static_cast<const char*>(sends[p]->sendBuf) != sendBase + p * bytes ||
        static_cast<char*>(recvs[p]->recvBuf) != recvBase + p * bytes) {
      return false;
    }
  }
  // allToAll's buffers must not overlap.
  if (sendBase < recvBase + n * bytes && recvBase < sendBase + n * bytes) return false;
  comm->comm->allToAll(sendBase, recvBase, ops[0].count, ops[0].type,
                       Stream{static_cast<void*>(ops[0].stream)});
  return true;
}

}  // namespace

int groupDepth() noexcept {
  return group.depth;
}

void groupAdd(GroupOp op) {
  group.ops.push_back(std::move(op));
}

void groupAddInit(std::function<void()> init) {
  group.inits.push_back(std::move(init));
}

void runP2pBatch(ncclComm* comm, std::vector<GroupOp>& ops) {
  for (GroupOp& op : ops) {
    op.stream = hostOrdered(op.kind == GroupOp::Send ? op.sendBuf : op.recvBuf, op.stream);
  }
  if (asAllToAll(comm, ops)) return;
  // Sends and receives with itself: matched in order, copied.
  std::vector<GroupOp*> selfSends, selfRecvs;
  for (GroupOp& op : ops) {
    if (op.peer != comm->rank) continue;
    (op.kind == GroupOp::Send ? selfSends : selfRecvs).push_back(&op);
  }
  if (selfSends.size() != selfRecvs.size()) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("a group has {} send(s) to this rank ({}) itself and {} receive(s) "
                            "from it: they must pair up",
                            selfSends.size(), comm->rank, selfRecvs.size()));
  }
  for (size_t i = 0; i < selfSends.size(); ++i) {
    const GroupOp& s = *selfSends[i];
    const GroupOp& r = *selfRecvs[i];
    const size_t bytes = s.count * sizeOf(s.type);
    if (bytes != r.count * sizeOf(r.type)) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("send to self of {} bytes matched with a receive of {} bytes", bytes,
                              r.count * sizeOf(r.type)));
    }
    if (bytes > 0 && (strata::isDeviceMemory(s.sendBuf) || strata::isDeviceMemory(r.recvBuf))) {
      throw Error(ErrorCode::NotSupported,
                  "a send to this rank itself on device memory is not supported yet (strata "
                  "copies to self on the host)");
    }
    if (bytes > 0 && s.sendBuf != r.recvBuf) std::memmove(r.recvBuf, s.sendBuf, bytes);
  }
  // The rest as one batch: strata completes it whatever the order of each rank's items (on
  // device memory it cuts the messages into one-round pieces and interleaves them).
  std::vector<PointToPoint> batch;
  cudaStream_t stream = nullptr;
  bool streamSet = false;
  for (const GroupOp& op : ops) {
    if (op.peer == comm->rank) continue;
    // Host items were ordered above (their stream is now null); device items keep theirs.
    const bool device =
        op.count > 0 &&
        strata::isDeviceMemory(op.kind == GroupOp::Send ? op.sendBuf
                                                        : static_cast<const void*>(op.recvBuf));
    if (device && streamSet && op.stream != stream) {
      throw Error(ErrorCode::NotSupported,
                  "a group's sends and receives on device memory use several streams; strata "
                  "runs a group's point-to-point calls on one stream (pass the same stream to "
                  "each, as PyTorch and nccl-tests do)");
    }
    if (device) {
      stream = op.stream;
      streamSet = true;
    }
    batch.push_back(op.kind == GroupOp::Send
                        ? PointToPoint::sendTo(op.sendBuf, op.count, op.type, op.peer)
                        : PointToPoint::recvFrom(op.recvBuf, op.count, op.type, op.peer));
  }
  comm->comm->sendRecv(batch, Stream{static_cast<void*>(stream)});
}

}  // namespace strata::nccl

using namespace strata::nccl;

NCCL_EXPORT ncclResult_t ncclGroupStart() {
  ++group.depth;
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclGroupStart, ())

namespace {

/// Ends the outermost group: inits (at once), then the calls in order, consecutive sends and
/// receives of one communicator as a batch. The first error is returned (later calls of a
/// communicator that failed are skipped; other communicators go on).
void runInits(std::vector<std::function<void()>>& inits) {
  std::vector<std::thread> threads;
  for (auto& init : inits) threads.emplace_back(std::move(init));
  for (auto& t : threads) t.join();
}

ncclResult_t runGroup(Group g) {
  ncclResult_t first = ncclSuccess;
  runInits(g.inits);
  std::vector<ncclComm*> failed;
  auto note = [&](ncclComm* comm, ncclResult_t r) {
    if (r == ncclSuccess) return;
    if (first == ncclSuccess) first = r;
    failed.push_back(comm);
  };
  // Calls on several communicators (one process driving several ranks, as nccl-tests -g
  // does) run at once, one thread per communicator: on host memory each call blocks until
  // its peers join, so one thread would wait for itself.
  std::vector<ncclComm*> comms;
  for (const GroupOp& op : g.ops) {
    if (std::find(comms.begin(), comms.end(), op.comm) == comms.end()) comms.push_back(op.comm);
  }
  if (comms.size() > 1) {
    std::vector<ncclResult_t> results(comms.size(), ncclSuccess);
    std::vector<std::thread> threads;
    for (size_t c = 0; c < comms.size(); ++c) {
      Group part;
      for (GroupOp& op : g.ops) {
        if (op.comm == comms[c]) part.ops.push_back(std::move(op));
      }
      threads.emplace_back(
          [&results, c, p = std::move(part)]() mutable { results[c] = runGroup(std::move(p)); });
    }
    for (auto& t : threads) t.join();
    for (ncclResult_t r : results) {
      if (r != ncclSuccess && first == ncclSuccess) first = r;
    }
    return first;
  }
  for (size_t i = 0; i < g.ops.size();) {
    ncclComm* comm = g.ops[i].comm;
    if (std::find(failed.begin(), failed.end(), comm) != failed.end()) {
      ++i;
      continue;
    }
    // A communicator whose init (in this group, or before it, non-blocking) failed or has not
    // finished takes no call.
    if (const int init = comm->initState.load(std::memory_order_acquire);
        init != ncclSuccess || !comm->comm) {
      note(comm,
           fail(comm, init == ncclInProgress ? ncclInvalidUsage : static_cast<ncclResult_t>(init),
                "a grouped call on a communicator whose initialisation failed or has not "
                "finished"));
      ++i;
      continue;
    }
    if (!isP2p(g.ops[i])) {
      note(comm, guarded(comm, g.ops[i].run));
      ++i;
      continue;
    }
    size_t j = i;
    while (j < g.ops.size() && isP2p(g.ops[j]) && g.ops[j].comm == comm) ++j;
    std::vector<GroupOp> batch(std::make_move_iterator(g.ops.begin() + static_cast<long>(i)),
                               std::make_move_iterator(g.ops.begin() + static_cast<long>(j)));
    note(comm, guarded(comm, [&] { runP2pBatch(comm, batch); }));
    i = j;
  }
  return first;
}

}  // namespace

NCCL_EXPORT ncclResult_t ncclGroupEnd() {
  if (group.depth == 0) {
    return fail(nullptr, ncclInvalidUsage, "ncclGroupEnd without a matching ncclGroupStart");
  }
  if (--group.depth > 0) return ncclSuccess;
  Group g = std::move(group);
  group = Group{};
  return runGroup(std::move(g));
}
NCCL_TWIN(ncclResult_t, ncclGroupEnd, ())

NCCL_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  if (simInfo == nullptr || simInfo->magic != 0x74685283) {
    return fail(nullptr, ncclInvalidArgument,
                "ncclGroupSimulateEnd: simInfo not set from NCCL_SIM_INFO_INITIALIZER");
  }
  if (group.depth == 0) {
    return fail(nullptr, ncclInvalidUsage, "ncclGroupSimulateEnd without ncclGroupStart");
  }
  if (--group.depth > 0) return ncclSuccess;
  // Nothing runs: the group's calls are dropped, as NCCL's simulation does not launch them.
  // strata has no performance model of its own to give: the estimate is left undefined.
  Group g = std::move(group);
  group = Group{};
  runInits(g.inits);  // an init cannot be simulated away: the communicator must exist
  simInfo->estimatedTime = NCCL_UNDEF_FLOAT;
  return ncclSuccess;
}
NCCL_TWIN(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t * simInfo))
