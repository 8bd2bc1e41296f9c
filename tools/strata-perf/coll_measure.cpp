#include "coll_measure.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "device.hpp"
#include "stats.hpp"

namespace strata::perf {
namespace {

using Clock = std::chrono::steady_clock;

/// The call through the NCCL API (--api nccl); sendrecv as nccl-tests issues it: one group.
void callNccl(NcclApi& api, const CollCase& c, const void* send, void* recv, Target at,
              bool grouped) {
  void* s = at.stream;
  switch (c.kind) {
    case CollKind::AllReduce:
      return api.allReduce(send, recv, c.count, c.type, c.op, s);
    case CollKind::AllGather:
      return api.allGather(send, recv, c.count, c.type, s);
    case CollKind::ReduceScatter:
      return api.reduceScatter(send, recv, c.count, c.type, c.op, s);
    case CollKind::Broadcast:
      return api.broadcast(send, recv, c.count, c.type, c.root, s);
    case CollKind::AllToAll:
      if (grouped) return api.allToAllGrouped(send, recv, c.count, c.type, c.nranks, s);
      return api.allToAll(send, recv, c.count, c.type, s);
    case CollKind::SendRecv:
      return api.sendRecv(send, (c.rank + 1) % c.nranks, recv, (c.rank - 1 + c.nranks) % c.nranks,
                          c.count, c.type, s);
  }
}

void callColl(Communicator& comm, const CollCase& c, const void* send, void* recv, Target at,
              const Issue& how) {
  if (how.nccl != nullptr) return callNccl(*how.nccl, c, send, recv, at, how.grouped);
  const Stream s{at.stream};
  switch (c.kind) {
    case CollKind::AllReduce:
      comm.allReduce(send, recv, c.count, c.type, c.op, s);
      return;
    case CollKind::AllGather:
      comm.allGather(send, recv, c.count, c.type, s);
      return;
    case CollKind::ReduceScatter:
      comm.reduceScatter(send, recv, c.count, c.type, c.op, s);
      return;
    case CollKind::Broadcast:
      comm.broadcast(send, recv, c.count, c.type, c.root, s);
      return;
    case CollKind::AllToAll:
      comm.allToAll(send, recv, c.count, c.type, s);
      return;
    case CollKind::SendRecv: {
      if (c.nranks == 1) {
        // nccl-tests sends to itself; here that is a copy, so that one rank runs too.
        if (at.device) {
          device::copyAsync(recv, send, c.count * sizeOf(c.type), at.stream);
        } else {
          std::memcpy(recv, send, c.count * sizeOf(c.type));
        }
        return;
      }
      // Host send/recv return when done, so a ring of sends first could wait forever; even ranks
      // send first and odd ranks receive first, which completes for any nranks (and in the same
      // order on a stream, where each call waits for its peer's).
      const int next = (c.rank + 1) % c.nranks;
      const int prev = (c.rank - 1 + c.nranks) % c.nranks;
      if (c.rank % 2 == 0) {
        comm.send(send, c.count, c.type, next, s);
        comm.recv(recv, c.count, c.type, prev, s);
      } else {
        comm.recv(recv, c.count, c.type, prev, s);
        comm.send(send, c.count, c.type, next, s);
      }
      return;
    }
  }
}

struct Placement {
  const void* send;
  void* recv;
  const void* result;
};

Placement placementFor(const CollCase& c, const Buffers& buf, bool inPlace) {
  if (!inPlace) return {buf.send(), buf.recv(), buf.recv()};
  const size_t own = static_cast<size_t>(c.rank) * c.count * sizeOf(c.type);
  switch (c.kind) {
    case CollKind::AllGather:
      return {buf.recv() + own, buf.recv(), buf.recv()};
    case CollKind::ReduceScatter:
      return {buf.send(), buf.send() + own, buf.send() + own};
    default:
      return {buf.recv(), buf.recv(), buf.recv()};
  }
}

void prepare(const CollCase& c, const Buffers& buf, bool inPlace) {
  if (!inPlace) {
    fillSend(c, buf.hostSend());
    poison(c.type, buf.hostRecv(), recvElements(c));
  } else {
    fillInPlace(c, c.kind == CollKind::ReduceScatter ? buf.hostSend() : buf.hostRecv());
  }
  buf.upload(wholeBytes(c));
}

}  // namespace

bool hasInPlace(CollKind kind) {
  return kind != CollKind::AllToAll && kind != CollKind::SendRecv;
}

size_t wholeBytes(const CollCase& c) {
  return std::max(sendElements(c), recvElements(c)) * sizeOf(c.type);
}

Measured measure(Communicator& comm, CollCase c, const Buffers& buf, bool inPlace, size_t iters,
                 size_t warmup, const Issue& how, int& rep) {
  Measured m;
  const Placement p = placementFor(c, buf, inPlace);
  const Target at = how.at;
  void* stream = at.stream;
  if (how.check) prepare(c, buf, inPlace);
  for (size_t i = 0; i < warmup; ++i) callColl(comm, c, p.send, p.recv, at, how);
  if (at.device) device::synchronize(stream);
  // As nccl-tests: the timed calls are captured once, untimed; the time is that of the launches.
  std::unique_ptr<device::Graph> graph;
  if (how.graph > 0) {
    graph = std::make_unique<device::Graph>();
    graph->begin(stream);
    for (size_t i = 0; i < iters; ++i) callColl(comm, c, p.send, p.recv, at, how);
    graph->end();
  }
  comm.bootstrap().barrier();
  const auto t0 = Clock::now();
  if (graph) {
    for (int l = 0; l < how.graph; ++l) {
      graph->launch(stream);
      if (how.blocking) device::synchronize(stream);
    }
  } else {
    for (size_t i = 0; i < iters; ++i) {
      callColl(comm, c, p.send, p.recv, at, how);
      if (at.device && how.blocking) device::synchronize(stream);
    }
  }
  if (at.device) device::synchronize(stream);
  m.us = usSince(t0) / static_cast<double>(iters * static_cast<size_t>(graph ? how.graph : 1));
  if (how.check) {
    // A separate iteration with fresh inputs (as nccl-tests), so that the check neither
    // disturbs the timing nor passes on data left by an earlier size; with -G it is a graph of
    // one call too, so that what runs from a graph is checked.
    c.seed = ++rep;
    prepare(c, buf, inPlace);
    if (how.graph > 0) {
      device::Graph once;
      once.begin(stream);
      callColl(comm, c, p.send, p.recv, at, how);
      once.end();
      once.launch(stream);
    } else {
      callColl(comm, c, p.send, p.recv, at, how);
    }
    if (at.device) device::synchronize(stream);
    m.wrong = countWrong(c, buf.result(p.result, recvElements(c) * sizeOf(c.type)));
  }
  return m;
}

size_t countFor(CollKind kind, size_t bytes, DataType type, int nranks) {
  const size_t elements = bytes / sizeOf(type);
  switch (kind) {
    case CollKind::AllGather:
    case CollKind::ReduceScatter:
    case CollKind::AllToAll:
      return elements / static_cast<size_t>(nranks);
    default:
      return elements;
  }
}

}  // namespace strata::perf
