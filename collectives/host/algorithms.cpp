#include "collectives/host/algorithms.hpp"

#include <algorithm>
#include <cstring>

#include "collectives/host/reduce.hpp"

namespace strata::collectives {

namespace {

OpSignature signature(OpKind kind, DataType type, ReduceOp op, int root, size_t count) {
  return {static_cast<uint16_t>(kind), static_cast<uint16_t>(type), static_cast<uint16_t>(op), root,
          static_cast<uint64_t>(count)};
}

Plan makePlan(Engine& e, const OpSignature& sig) {
  Plan plan;
  plan.sig = sig;
  plan.in.resize(static_cast<size_t>(e.size()));
  return plan;
}

/// One reduction round per chunk of [0, bytes): dst + off = op over ranks of (own + off, each
/// peer's chunk). Peers' pieces are expected in the same chunking.
void addRounds(Engine& e, Plan& plan, char* dst, const char* own, size_t bytes, size_t typeSize) {
  const size_t chunk = e.chunkBytes();
  for (size_t off = 0; off < bytes; off += chunk) {
    size_t n = std::min(chunk, bytes - off);
    int r = static_cast<int>(plan.rounds.size());
    plan.rounds.push_back({dst + off, own + off, n / typeSize, nullptr});
    for (int p = 0; p < e.size(); ++p) {
      if (p != e.rank()) plan.in[p].push_back({nullptr, n, off, r});
    }
  }
}

void copyIfDistinct(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes) std::memmove(dst, src, bytes);
}

}  // namespace

void allReduce(Engine& e, const void* send, void* recv, size_t count, DataType type, ReduceOp op) {
  const size_t ts = sizeOf(type);
  const size_t bytes = count * ts;
  if (count == 0) return;
  if (e.size() == 1) {
    copyIfDistinct(recv, send, bytes);
    return;
  }
  e.type = type;
  e.redop = op;
  auto sig = signature(OpKind::AllReduce, type, op, -1, count);
  Plan plan = makePlan(e, sig);
  const char* s = static_cast<const char*>(send);
  char* d = static_cast<char*>(recv);
  bool oneshot =
      e.algorithm() == "oneshot" || (e.algorithm() == "auto" && bytes <= e.oneshotMaxBytes());
  if (oneshot) {
    // Every rank gets every input and reduces all of it in rank order, so every rank computes
    // bit-identical results.
    std::vector<uint64_t> base(static_cast<size_t>(e.size()));
    for (int p = 0; p < e.size(); ++p) {
      if (p == e.rank()) continue;
      base[p] = e.sentAfterQueue(p);
      e.queueSend(p, s, bytes, sig);
    }
    addRounds(e, plan, d, s, bytes, ts);
    if (s == d) {
      // In place, round r overwrites chunk r of the input: it must have gone to every peer.
      for (size_t r = 0; r < plan.rounds.size(); ++r) {
        std::vector<uint64_t> need(base);
        for (auto& v : need) v += r + 1;
        plan.minSent.push_back(std::move(need));
      }
    }
    e.run(plan, "allReduce");
    return;
  }
  // Two-shot: block b (a contiguous 1/size of the elements) is reduced by rank b from every
  // rank's block b (reduce-scatter), then rank b sends the result to every rank (all-gather).
  // A chunk goes out as soon as its round is reduced, so the two phases overlap.
  const size_t n = static_cast<size_t>(e.size());
  size_t blk = (count + n - 1) / n;
  blk = (blk + 15) / 16 * 16;  // whole vectors per block
  auto start = [&](size_t b) { return std::min(count, b * blk) * ts; };
  auto length = [&](size_t b) { return start(b + 1) - start(b); };
  const size_t me = static_cast<size_t>(e.rank());
  for (size_t p = 0; p < n; ++p) {
    if (p != me) e.queueSend(static_cast<int>(p), s + start(p), length(p), sig);
  }
  addRounds(e, plan, d + start(me), s + start(me), length(me), ts);
  for (auto& round : plan.rounds) {
    char* dst = round.dst;
    size_t off = static_cast<size_t>(dst - (d + start(me)));
    size_t len = round.count * ts;
    round.after = [&e, dst, off, len, sig, me, n]() {
      for (size_t p = 0; p < n; ++p) {
        if (p != me) e.queueSend(static_cast<int>(p), dst, len, sig, off);
      }
    };
  }
  for (size_t p = 0; p < n; ++p) {
    if (p != me)
      Engine::expectCopy(plan, static_cast<int>(p), d + start(p), length(p), e.chunkBytes());
  }
  e.run(plan, "allReduce");
}

void allGather(Engine& e, const void* send, void* recv, size_t sendCount, DataType type) {
  const size_t bytes = sendCount * sizeOf(type);
  if (sendCount == 0) return;
  char* d = static_cast<char*>(recv);
  auto sig = signature(OpKind::AllGather, type, ReduceOp::Sum, -1, sendCount);
  Plan plan = makePlan(e, sig);
  for (int p = 0; p < e.size(); ++p) {
    if (p == e.rank()) continue;
    e.queueSend(p, send, bytes, sig);
    Engine::expectCopy(plan, p, d + static_cast<size_t>(p) * bytes, bytes, e.chunkBytes());
  }
  copyIfDistinct(d + static_cast<size_t>(e.rank()) * bytes, send, bytes);
  if (e.size() > 1) e.run(plan, "allGather");
}

void reduceScatter(Engine& e, const void* send, void* recv, size_t recvCount, DataType type,
                   ReduceOp op) {
  const size_t ts = sizeOf(type);
  const size_t bytes = recvCount * ts;
  if (recvCount == 0) return;
  const char* s = static_cast<const char*>(send);
  const size_t me = static_cast<size_t>(e.rank());
  if (e.size() == 1) {
    copyIfDistinct(recv, s, bytes);
    return;
  }
  e.type = type;
  e.redop = op;
  auto sig = signature(OpKind::ReduceScatter, type, op, -1, recvCount);
  Plan plan = makePlan(e, sig);
  for (int p = 0; p < e.size(); ++p) {
    if (p != e.rank()) e.queueSend(p, s + static_cast<size_t>(p) * bytes, bytes, sig);
  }
  addRounds(e, plan, static_cast<char*>(recv), s + me * bytes, bytes, ts);
  e.run(plan, "reduceScatter");
}

void broadcast(Engine& e, const void* send, void* recv, size_t count, DataType type, int root) {
  const size_t bytes = count * sizeOf(type);
  if (count == 0) return;
  auto sig = signature(OpKind::Broadcast, type, ReduceOp::Sum, root, count);
  Plan plan = makePlan(e, sig);
  if (e.rank() == root) {
    for (int p = 0; p < e.size(); ++p) {
      if (p != root) e.queueSend(p, send, bytes, sig);
    }
    copyIfDistinct(recv, send, bytes);
  } else {
    Engine::expectCopy(plan, root, recv, bytes, e.chunkBytes());
  }
  if (e.size() > 1) e.run(plan, "broadcast");
}

void allToAll(Engine& e, const void* send, void* recv, size_t countPerRank, DataType type) {
  const size_t bytes = countPerRank * sizeOf(type);
  if (countPerRank == 0) return;
  const char* s = static_cast<const char*>(send);
  char* d = static_cast<char*>(recv);
  auto sig = signature(OpKind::AllToAll, type, ReduceOp::Sum, -1, countPerRank);
  Plan plan = makePlan(e, sig);
  for (int p = 0; p < e.size(); ++p) {
    if (p == e.rank()) continue;
    e.queueSend(p, s + static_cast<size_t>(p) * bytes, bytes, sig);
    Engine::expectCopy(plan, p, d + static_cast<size_t>(p) * bytes, bytes, e.chunkBytes());
  }
  size_t me = static_cast<size_t>(e.rank());
  copyIfDistinct(d + me * bytes, s + me * bytes, bytes);
  if (e.size() > 1) e.run(plan, "allToAll");
}

void send(Engine& e, const void* buf, size_t count, DataType type, int peer) {
  if (count == 0) return;
  auto sig = signature(OpKind::SendRecv, type, ReduceOp::Sum, -1, count);
  e.queueSend(peer, buf, count * sizeOf(type), sig);
  e.flushSendsOrBuffer(peer);
}

void recv(Engine& e, void* buf, size_t count, DataType type, int peer) {
  if (count == 0) return;
  auto sig = signature(OpKind::SendRecv, type, ReduceOp::Sum, -1, count);
  Plan plan = makePlan(e, sig);
  plan.waitForSends = false;
  Engine::expectCopy(plan, peer, buf, count * sizeOf(type), e.chunkBytes());
  e.run(plan, "recv");
}

}  // namespace strata::collectives
