#include "algorithms.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "call.hpp"
#include "reduce.hpp"
#include "stream_copy.hpp"

namespace strata::collectives {

namespace {

using backend::CollectiveOp;

OpKind kindOf(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::AllReduce:
      return OpKind::AllReduce;
    case CollectiveOp::AllGather:
      return OpKind::AllGather;
    case CollectiveOp::ReduceScatter:
      return OpKind::ReduceScatter;
    case CollectiveOp::Broadcast:
      return OpKind::Broadcast;
    case CollectiveOp::AllToAll:
      return OpKind::AllToAll;
    case CollectiveOp::Send:
    case CollectiveOp::Recv:
    case CollectiveOp::SendRecv:
      return OpKind::SendRecv;
  }
  throw Error(ErrorCode::Internal,
              fmt::format("no chunk operation for collective op {}", static_cast<int>(op)));
}

/// A value of the call as a chunk header field of type Field: an error, never a truncation.
template <typename Field, typename Value>
Field headerField(Value value, const char* name, const CollectiveRequest& call) {
  if (!std::in_range<Field>(value)) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{}: {} {} does not fit the {}-bit field of the host collectives' "
                            "chunk header",
                            backend::toString(call.op), name, value, 8 * sizeof(Field)));
  }
  return static_cast<Field>(value);
}

}  // namespace

/// What every chunk of the call carries (docs/wire-format.md, "Collective chunks"): the reduce
/// op only for reducing ops, the root only for broadcast.
OpSignature signatureOf(const CollectiveRequest& call) {
  const bool reduces = call.op == CollectiveOp::AllReduce || call.op == CollectiveOp::ReduceScatter;
  OpSignature sig;
  sig.op = static_cast<uint16_t>(kindOf(call.op));
  sig.type = headerField<uint16_t>(static_cast<int>(call.type), "data type", call);
  sig.redop = reduces ? headerField<uint16_t>(static_cast<int>(call.redop), "reduce op", call)
                      : uint16_t{0};
  sig.root =
      call.op == CollectiveOp::Broadcast ? headerField<int32_t>(call.root, "root", call) : -1;
  sig.count = headerField<uint64_t>(call.count, "count", call);
  return sig;
}

Plan makePlan(Engine& e, const OpSignature& sig) {
  Plan plan;
  plan.sig = sig;
  plan.type = static_cast<DataType>(sig.type);
  plan.redop = static_cast<ReduceOp>(sig.redop);
  plan.in.resize(static_cast<size_t>(e.size()));
  return plan;
}

void copyIfDistinct(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes) std::memmove(dst, src, bytes);
}

std::pair<size_t, size_t> bufferBytes(const CollectiveRequest& call, size_t n) {
  const size_t b = call.bytes();
  switch (call.op) {
    case CollectiveOp::AllGather:
      return {b, n * b};
    case CollectiveOp::ReduceScatter:
      return {n * b, b};
    case CollectiveOp::AllToAll:
      return {n * b, n * b};
    default:
      return {b, b};
  }
}

bool streamsCall(const Engine& e, const CollectiveRequest& call) {
  auto [sendBytes, recvBytes] = bufferBytes(call, static_cast<size_t>(e.size()));
  return e.streams(uint64_t{sendBytes} + recvBytes);
}

namespace {

/// One reduction round per chunk of [0, bytes): dst + off = op over members (default: every
/// rank) of (own + off, each member's chunk). Members' pieces are expected in the same chunking.
void addRounds(Engine& e, Plan& plan, char* dst, const char* own, size_t bytes, size_t typeSize,
               const std::vector<int>* members = nullptr, int divisor = -1) {
  const size_t chunk = e.pieceBytes(bytes);
  const size_t rounds = (bytes + chunk - 1) / chunk;
  plan.rounds.reserve(plan.rounds.size() + rounds);
  for (int p : members ? *members : e.allRanks()) {
    if (p != e.rank()) plan.in[p].reserve(plan.in[p].size() + rounds);
  }
  for (size_t off = 0; off < bytes; off += chunk) {
    size_t n = std::min(chunk, bytes - off);
    int r = static_cast<int>(plan.rounds.size());
    Round round;
    round.dst = dst + off;
    round.own = own + off;
    round.count = n / typeSize;
    round.members = members;
    round.divisor = divisor;
    plan.rounds.push_back(std::move(round));
    auto expect = [&](int p) {
      if (p != e.rank()) plan.in[p].push_back({nullptr, n, off, r, {}});
    };
    for (int p : members ? *members : e.allRanks()) expect(p);
  }
}

/// Two-shot allReduce among members (this rank one of them) of count elements: block k of
/// the elements is reduced by members[k] from every member's block k (reduce-scatter), then
/// sent to every member (all-gather). A chunk goes out as soon as its round is reduced, so the
/// two phases overlap.
void twoShot(Engine& e, const OpSignature& sig, const char* s, char* d, size_t count, size_t ts,
             const std::vector<int>& members, const char* what, bool stream) {
  const size_t n = members.size();
  const size_t me =
      static_cast<size_t>(std::find(members.begin(), members.end(), e.rank()) - members.begin());
  Blocks bl(count, n, ts);
  Plan plan = makePlan(e, sig);
  plan.stream = stream;
  for (size_t k = 0; k < n; ++k) {
    if (k != me) e.queueSend(members[k], s + bl.start(k), bl.length(k), sig);
  }
  addRounds(e, plan, d + bl.start(me), s + bl.start(me), bl.length(me), ts, &members, -1);
  for (auto& round : plan.rounds) {
    // Each reduced chunk goes to every member (the all-gather half) as soon as it is ready.
    round.forwardTo = &members;
    round.forwardOffset = static_cast<uint64_t>(round.dst - (d + bl.start(me)));
  }
  for (size_t k = 0; k < n; ++k) {
    if (k != me)
      Engine::expectCopy(plan, members[k], d + bl.start(k), bl.length(k),
                         e.pieceBytes(bl.length(k)));
  }
  e.run(plan, what);
}

}  // namespace

bool hierarchicalLayout(const Engine& e) {
  const auto& hosts = e.hosts();
  if (hosts.size() < 2 || hosts[0].size() < 2) return false;
  for (const auto& h : hosts) {
    if (h.size() != hosts[0].size()) return false;
  }
  return true;
}

namespace {

/// Hierarchical allReduce: (A) reduce-scatter inside each host (shm) into partial sums of one
/// block per local rank, (B) two-shot allReduce of that block among the ranks with the same
/// local index on every host (fabric), (C) all-gather of the blocks inside each host. Only
/// 1/L of the data crosses hosts per rank, over H-1 peers instead of N-1.
void hierarchicalAllReduce(Engine& e, const OpSignature& sig, const CollectiveRequest& call) {
  const char* s = static_cast<const char*>(call.send);
  char* d = static_cast<char*>(call.recv);
  const size_t ts = sizeOf(call.type);
  const auto& hosts = e.hosts();
  size_t hi = 0, li = 0;
  for (size_t h = 0; h < hosts.size(); ++h) {
    for (size_t l = 0; l < hosts[h].size(); ++l) {
      if (hosts[h][l] == e.rank()) hi = h, li = l;
    }
  }
  const std::vector<int>& local = hosts[hi];
  std::vector<int> cross;
  for (const auto& h : hosts) cross.push_back(h[li]);
  Blocks lb(call.count, local.size(), ts);

  Plan a = makePlan(e, sig);
  for (size_t q = 0; q < local.size(); ++q) {
    if (q != li) e.queueSend(local[q], s + lb.start(q), lb.length(q), sig);
  }
  addRounds(e, a, d + lb.start(li), s + lb.start(li), lb.length(li), ts, &local, 1);
  e.run(a, "allReduce (within the host)");

  char* block = d + lb.start(li);
  const bool stream = streamsCall(e, call);
  twoShot(e, sig, block, block, lb.length(li) / ts, ts, cross, "allReduce (across hosts)", stream);

  Plan c = makePlan(e, sig);
  c.stream = stream;
  for (size_t q = 0; q < local.size(); ++q) {
    if (q == li) continue;
    e.queueSend(local[q], block, lb.length(li), sig);
    Engine::expectCopy(c, local[q], d + lb.start(q), lb.length(q), e.pieceBytes(lb.length(q)));
  }
  e.run(c, "allReduce (within the host)");
}

}  // namespace

namespace {

/// The cases every allReduce algorithm shares: nothing to do, or one rank. True when done.
bool trivialAllReduce(Engine& e, const CollectiveRequest& call) {
  if (call.count == 0) return true;
  if (e.size() == 1) {
    copyIfDistinct(call.recv, call.send, call.bytes());
    return true;
  }
  return false;
}

}  // namespace

void allReduceOneShot(Engine& e, const CollectiveRequest& call) {
  if (trivialAllReduce(e, call)) return;
  const OpSignature sig = signatureOf(call);
  const size_t bytes = call.bytes();
  const char* s = static_cast<const char*>(call.send);
  char* d = static_cast<char*>(call.recv);
  // Every rank gets every input and reduces all of it in rank order, so every rank computes
  // bit-identical results.
  Plan plan = makePlan(e, sig);
  std::vector<uint64_t> base(static_cast<size_t>(e.size()));
  for (int p = 0; p < e.size(); ++p) {
    if (p == e.rank()) continue;
    base[p] = e.sentAfterQueue(p);
    e.queueSend(p, s, bytes, sig);
  }
  addRounds(e, plan, d, s, bytes, sizeOf(call.type));
  if (s == d) {
    // In place, round r overwrites chunk r of the input: it must have gone to every peer.
    for (size_t r = 0; r < plan.rounds.size(); ++r) {
      std::vector<uint64_t> need(base);
      for (auto& v : need) v += r + 1;
      plan.minSent.push_back(std::move(need));
    }
  }
  e.run(plan, "allReduce");
}

void allReduceTwoShot(Engine& e, const CollectiveRequest& call) {
  if (trivialAllReduce(e, call)) return;
  twoShot(e, signatureOf(call), static_cast<const char*>(call.send), static_cast<char*>(call.recv),
          call.count, sizeOf(call.type), e.allRanks(), "allReduce", streamsCall(e, call));
}

void allReduceHierarchical(Engine& e, const CollectiveRequest& call) {
  if (trivialAllReduce(e, call)) return;
  hierarchicalAllReduce(e, signatureOf(call), call);
}

void allGather(Engine& e, const CollectiveRequest& call) {
  const size_t bytes = call.bytes();
  if (call.count == 0) return;
  const OpSignature sig = signatureOf(call);
  const void* send = call.send;
  char* d = static_cast<char*>(call.recv);
  const bool stream = streamsCall(e, call);
  auto own = [&] { copyOut(stream, d + static_cast<size_t>(e.rank()) * bytes, send, bytes); };
  if (e.size() == 1) {
    own();
    return;
  }
  Plan plan = makePlan(e, sig);
  plan.stream = stream;
  plan.localWork = own;
  for (int p = 0; p < e.size(); ++p) {
    if (p == e.rank()) continue;
    e.queueSend(p, send, bytes, sig);
    Engine::expectCopy(plan, p, d + static_cast<size_t>(p) * bytes, bytes, e.pieceBytes(bytes));
  }
  e.run(plan, "allGather");
}

void reduceScatter(Engine& e, const CollectiveRequest& call) {
  const size_t bytes = call.bytes();
  if (call.count == 0) return;
  const char* s = static_cast<const char*>(call.send);
  void* recv = call.recv;
  const size_t me = static_cast<size_t>(e.rank());
  if (e.size() == 1) {
    copyIfDistinct(recv, s, bytes);
    return;
  }
  const OpSignature sig = signatureOf(call);
  Plan plan = makePlan(e, sig);
  for (int p = 0; p < e.size(); ++p) {
    if (p != e.rank()) e.queueSend(p, s + static_cast<size_t>(p) * bytes, bytes, sig);
  }
  addRounds(e, plan, static_cast<char*>(recv), s + me * bytes, bytes, sizeOf(call.type));
  e.run(plan, "reduceScatter");
}

void broadcast(Engine& e, const CollectiveRequest& call) {
  const size_t bytes = call.bytes();
  if (call.count == 0) return;
  const void* send = call.send;
  void* recv = call.recv;
  const int root = call.root;
  if (e.size() == 1) {
    copyIfDistinct(recv, send, bytes);
    return;
  }
  const OpSignature sig = signatureOf(call);
  Plan plan = makePlan(e, sig);
  plan.stream = streamsCall(e, call);
  if (e.rank() == root) {
    for (int p = 0; p < e.size(); ++p) {
      if (p != root) e.queueSend(p, send, bytes, sig);
    }
    plan.localWork = [&] { copyOut(plan.stream, recv, send, bytes); };
  } else {
    Engine::expectCopy(plan, root, recv, bytes, e.pieceBytes(bytes));
  }
  e.run(plan, "broadcast");
}

void allToAll(Engine& e, const CollectiveRequest& call) {
  const size_t bytes = call.bytes();
  if (call.count == 0) return;
  const char* s = static_cast<const char*>(call.send);
  char* d = static_cast<char*>(call.recv);
  const OpSignature sig = signatureOf(call);
  const size_t me = static_cast<size_t>(e.rank());
  const bool stream = streamsCall(e, call);
  auto own = [&] { copyOut(stream, d + me * bytes, s + me * bytes, bytes); };
  if (e.size() == 1) {
    own();
    return;
  }
  Plan plan = makePlan(e, sig);
  plan.stream = stream;
  plan.localWork = own;
  for (int p = 0; p < e.size(); ++p) {
    if (p == e.rank()) continue;
    e.queueSend(p, s + static_cast<size_t>(p) * bytes, bytes, sig);
    Engine::expectCopy(plan, p, d + static_cast<size_t>(p) * bytes, bytes, e.pieceBytes(bytes));
  }
  e.run(plan, "allToAll");
}

void send(Engine& e, const CollectiveRequest& call) {
  if (call.count == 0) return;
  e.queueSend(call.peer, call.send, call.bytes(), signatureOf(call));
  e.flushSendsOrBuffer(call.peer);
}

void sendRecv(Engine& e, const CollectiveRequest& call) {
  // Sends never wait for their receiver (slots, or a buffer when they are full), so every
  // rank's sends go first and its receives after them: each rank's batch completes whatever
  // the order of its items.
  auto one = [&](const PointToPoint& p) {
    CollectiveRequest r;
    r.op = p.kind == PointToPoint::Kind::Send ? CollectiveOp::Send : CollectiveOp::Recv;
    r.send = p.send;
    r.recv = p.recv;
    r.count = p.count;
    r.type = p.type;
    r.peer = p.peer;
    return r;
  };
  for (const PointToPoint& p : call.batch) {
    if (p.kind == PointToPoint::Kind::Send) send(e, one(p));
  }
  for (const PointToPoint& p : call.batch) {
    if (p.kind == PointToPoint::Kind::Recv) recv(e, one(p));
  }
}

void recv(Engine& e, const CollectiveRequest& call) {
  if (call.count == 0) return;
  Plan plan = makePlan(e, signatureOf(call));
  plan.waitForSends = false;
  plan.stream = e.streams(call.bytes());
  Engine::expectCopy(plan, call.peer, call.recv, call.bytes(), e.pieceBytes(call.bytes()));
  e.run(plan, "recv");
}

}  // namespace strata::collectives
