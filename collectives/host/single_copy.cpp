// Single copy: after one round of descriptors, each reader copies what it needs straight from
// the owner's buffer: through the owner's allocHost memory mapped here (zero copy: plain loads,
// and reductions read the peers' buffers in place), else with process_vm_readv.

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include <strata/backend/host_memory.hpp>
#include <strata/error.hpp>

#include "algorithms.hpp"
#include "base/wire.hpp"
#include "call.hpp"
#include "reduce.hpp"
#include "stream_copy.hpp"

namespace strata::collectives {

using backend::CollectiveOp;

namespace {

uint64_t addressOf(const void* p) {
  return reinterpret_cast<uint64_t>(p);
}

PeerBuffer describe(const void* buffer, size_t bytes) {
  PeerBuffer b;
  b.address = addressOf(buffer);
  if (buffer && bytes) {
    if (auto region = backend::findSharedHost(buffer, bytes)) b.region = *region;
  }
  return b;
}

void sendDone(Engine& e, int peer, const OpSignature& sig) {
  uint64_t one = 1;
  e.queueCopy(peer, &one, sizeof one, sig, 2);
}

void expectDone(Plan& plan, int peer, uint64_t* sink) {
  plan.in[peer].push_back({reinterpret_cast<char*>(sink), sizeof(uint64_t), 2, -1, {}});
}

/// dst = op over ranks of bytes [offset, offset + bytes) of every rank's send buffer (own: the
/// local one): in place from the peers' mappings where their buffers are shared, else through
/// a reused staging buffer filled with process_vm_readv, in pieces.
void reduceFromPeers(Engine& e, const Descriptors& d, const char* own, char* dst, uint64_t offset,
                     size_t bytes, DataType type, ReduceOp op) {
  const size_t ts = sizeOf(type);
  const size_t n = static_cast<size_t>(e.size());
  const size_t me = static_cast<size_t>(e.rank());
  const size_t piece = 256 * 1024;  // a few pieces of every peer stay in the L2 cache
  std::vector<const char*> views(n);
  bool staged = false;
  for (size_t p = 0; p < n; ++p) {
    if (p == me) continue;
    views[p] = e.peerView(static_cast<int>(p), d.ranks[p].send, d.ranks[p].frees, offset, bytes);
    staged |= views[p] == nullptr;
  }
  char* temp = staged ? e.temp(piece * n) : nullptr;
  std::vector<const void*> srcs(n);
  for (size_t off = 0; off < bytes; off += piece) {
    size_t len = std::min(piece, bytes - off);
    for (size_t p = 0; p < n; ++p) {
      if (p == me) {
        srcs[p] = own + off;
      } else if (views[p]) {
        srcs[p] = views[p] + off;
      } else {
        e.readFrom(static_cast<int>(p), d.ranks[p].send.address + offset + off, temp + p * piece,
                   len);
        srcs[p] = temp + p * piece;
      }
    }
    reduceMany(dst + off, srcs.data(), n, len / ts, type, op);
    if (op == ReduceOp::Avg) divideBy(dst + off, len / ts, type, e.size());
  }
}

/// Copies bytes at offset of peer's buffer b into dst: from its mapping (streaming stores when
/// stream), else process_vm_readv.
void readPeer(Engine& e, int peer, const PeerBuffer& b, uint64_t frees, uint64_t offset, void* dst,
              size_t bytes, bool stream) {
  if (bytes == 0) return;
  if (const char* v = e.peerView(peer, b, frees, offset, bytes)) {
    copyOut(stream, dst, v, bytes);
  } else {
    e.readFrom(peer, b.address + offset, dst, bytes);
  }
}

void allReduce(Engine& e, const OpSignature& sig, const CollectiveRequest& call,
               const Descriptors& d, bool stream) {
  const char* s = static_cast<const char*>(call.send);
  char* dst = static_cast<char*>(call.recv);
  const size_t n = static_cast<size_t>(e.size());
  const size_t me = static_cast<size_t>(e.rank());
  const Blocks bl(call.count, n, sizeOf(call.type));
  // Reduce this rank's block from every send buffer, then tell every peer it can be read.
  reduceFromPeers(e, d, s + bl.start(me), dst + bl.start(me), bl.start(me), bl.length(me),
                  call.type, call.redop);
  Plan plan = makePlan(e, sig);
  std::vector<uint64_t> sink(n);
  uint64_t one = 1;
  for (size_t p = 0; p < n; ++p) {
    if (p == me) continue;
    const int peer = static_cast<int>(p);
    e.queueCopy(peer, &one, sizeof one, sig, 1);
    plan.in[p].push_back({nullptr, sizeof(uint64_t), 1, -1, [&, p, peer](const char*) {
                            readPeer(e, peer, d.ranks[p].recv, d.ranks[p].frees, bl.start(p),
                                     dst + bl.start(p), bl.length(p), stream);
                            sendDone(e, peer, sig);
                          }});
    expectDone(plan, peer, &sink[p]);
  }
  e.run(plan, "allReduce");
}

/// allGather and allToAll: each reader copies one region of each peer's send buffer into its
/// recv buffer (srcOffset(p), dst(p)); owners wait for every reader's "done".
template <typename SrcOffset, typename Dst>
void gather(Engine& e, const OpSignature& sig, const Descriptors& d, size_t bytes,
            SrcOffset srcOffset, Dst dstOf, const char* what, bool stream,
            std::function<void()> own) {
  const size_t n = static_cast<size_t>(e.size());
  const size_t me = static_cast<size_t>(e.rank());
  Plan plan = makePlan(e, sig);
  std::vector<uint64_t> sink(n);
  // Start with the next rank, so that the ranks do not all read rank 0 first.
  for (size_t i = 1; i < n; ++i) {
    const size_t p = (me + i) % n;
    const int peer = static_cast<int>(p);
    readPeer(e, peer, d.ranks[p].send, d.ranks[p].frees, srcOffset(peer), dstOf(peer), bytes,
             stream);
    sendDone(e, peer, sig);
    expectDone(plan, peer, &sink[p]);
  }
  own();
  e.run(plan, what);
}

}  // namespace

std::vector<uint8_t> encodeDesc(const Desc& d) {
  wire::Writer w;
  w.u64(d.frees);
  for (const PeerBuffer* b : {&d.send, &d.recv}) {
    w.u64(b->address).u64(b->region.id);
    w.u32(static_cast<uint32_t>(b->region.fd));
    w.u64(b->region.inode).u64(b->region.bytes).u64(b->region.offset);
  }
  return w.take();
}

Desc decodeDesc(const char* payload, size_t bytes, int peer) {
  // Formatted on the stack: one of these per peer per call.
  char text[64];
  const auto end = fmt::format_to_n(text, sizeof text, "single-copy descriptor from rank {}", peer);
  const std::string_view what(text, std::min(end.size, sizeof text));
  wire::Reader r({reinterpret_cast<const uint8_t*>(payload), bytes}, what);
  Desc d;
  d.frees = r.u64("frees");
  for (PeerBuffer* b : {&d.send, &d.recv}) {
    b->address = r.u64("address");
    b->region.id = r.u64("allocation id");
    b->region.fd = static_cast<int32_t>(r.u32("fd"));
    b->region.inode = r.u64("inode");
    b->region.bytes = r.u64("allocation bytes");
    b->region.offset = r.u64("offset");
    if (b->region.id != 0 &&
        (b->region.fd < 0 || b->region.bytes == 0 || b->region.offset >= b->region.bytes)) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("{}: allocation {} has fd {}, {} bytes, buffer at offset {} (a "
                              "shared allocation needs fd >= 0 and offset < bytes)",
                              what, b->region.id, b->region.fd, b->region.bytes, b->region.offset),
                  peer);
    }
  }
  r.expectEnd();
  return d;
}

bool trivialCall(Engine& e, const CollectiveRequest& call) {
  if (call.count == 0) return true;
  if (e.size() > 1) return false;
  // One rank: every op's result is its own block (allGather and allToAll: block 0).
  copyIfDistinct(call.recv, call.send, call.bytes());
  return true;
}

Descriptors exchangeDescriptors(Engine& e, const CollectiveRequest& call) {
  const OpSignature sig = signatureOf(call);
  const size_t n = static_cast<size_t>(e.size());
  const size_t me = static_cast<size_t>(e.rank());
  Descriptors out;
  out.ranks.resize(n);
  auto [sendBytes, recvBytes] = bufferBytes(call, n);
  Desc& mine = out.ranks[me];
  mine.send = describe(call.send, sendBytes);
  mine.recv = describe(call.recv, recvBytes);
  mine.frees = backend::sharedHostFrees();
  const std::vector<uint8_t> wire = encodeDesc(mine);
  Plan plan = makePlan(e, sig);
  for (size_t p = 0; p < n; ++p) {
    if (p == me) continue;
    e.queueCopy(static_cast<int>(p), wire.data(), wire.size(), sig, 0);
    plan.in[p].push_back({nullptr, kDescBytes, 0, 0, {}});
  }
  Round round;
  round.action = [&](const std::vector<const char*>& payloads) {
    for (size_t p = 0; p < n; ++p) {
      if (p != me) out.ranks[p] = decodeDesc(payloads[p], kDescBytes, static_cast<int>(p));
    }
  };
  plan.rounds.push_back(std::move(round));
  e.run(plan, backend::toString(call.op).data());
  // What the peers read: every send buffer, and for allReduce every recv buffer too (the
  // gathered blocks); for broadcast only the root's send buffer.
  bool all = e.zeroCopy();
  for (size_t p = 0; p < n && all; ++p) {
    const Desc& x = out.ranks[p];
    if (call.op == CollectiveOp::Broadcast) {
      if (static_cast<int>(p) == call.root) all = x.send.shared();
    } else {
      all = x.send.shared() && (call.op != CollectiveOp::AllReduce || x.recv.shared());
    }
  }
  out.allShared = all;
  return out;
}

void singleCopy(Engine& e, const CollectiveRequest& call, const Descriptors& d) {
  const OpSignature sig = signatureOf(call);
  const size_t bytes = call.bytes();
  const size_t me = static_cast<size_t>(e.rank());
  const size_t n = static_cast<size_t>(e.size());
  char* recv = static_cast<char*>(call.recv);
  const char* send = static_cast<const char*>(call.send);
  const bool stream = streamsCall(e, call);
  switch (call.op) {
    case CollectiveOp::AllReduce:
      return allReduce(e, sig, call, d, stream);
    case CollectiveOp::AllGather:
      return gather(
          e, sig, d, bytes, [](int) { return uint64_t{0}; },
          [&](int p) { return recv + static_cast<size_t>(p) * bytes; }, "allGather", stream,
          [&] { copyOut(stream, recv + me * bytes, send, bytes); });
    case CollectiveOp::AllToAll:
      return gather(
          e, sig, d, bytes, [&](int) { return uint64_t{me * bytes}; },
          [&](int p) { return recv + static_cast<size_t>(p) * bytes; }, "allToAll", stream,
          [&] { copyOut(stream, recv + me * bytes, send + me * bytes, bytes); });
    case CollectiveOp::ReduceScatter: {
      reduceFromPeers(e, d, send + me * bytes, recv, me * bytes, bytes, call.type, call.redop);
      Plan plan = makePlan(e, sig);
      std::vector<uint64_t> sink(n);
      for (size_t p = 0; p < n; ++p) {
        if (p == me) continue;
        sendDone(e, static_cast<int>(p), sig);
        expectDone(plan, static_cast<int>(p), &sink[p]);
      }
      return e.run(plan, "reduceScatter");
    }
    case CollectiveOp::Broadcast: {
      const int root = call.root;
      Plan plan = makePlan(e, sig);
      std::vector<uint64_t> sink(n);
      if (e.rank() == root) {
        for (size_t p = 0; p < n; ++p) {
          if (static_cast<int>(p) != root) expectDone(plan, static_cast<int>(p), &sink[p]);
        }
        copyOut(stream, recv, send, bytes);
      } else {
        const Desc& r = d.ranks[static_cast<size_t>(root)];
        readPeer(e, root, r.send, r.frees, 0, recv, bytes, stream);
        sendDone(e, root, sig);
      }
      return e.run(plan, "broadcast");
    }
    case CollectiveOp::Send:
    case CollectiveOp::Recv:
    case CollectiveOp::SendRecv:
      break;
  }
  throw Error(ErrorCode::Internal,
              fmt::format("single copy was asked to run {}", backend::toString(call.op)));
}

}  // namespace strata::collectives
