// The Communicator: argument checks, memory classification, creation, the public methods and
// the run of the algorithm that selection.cpp chose (failure_note.cpp explains a failure).

#include <strata/communicator.hpp>

#include <cstdint>
#include <limits>
#include <mutex>

#include <fmt/format.h>

#include <strata/backend/host_memory.hpp>
#include <strata/error.hpp>
#include <strata/transport.hpp>

#include "base/config_keys.hpp"
#include "bootstrap/watched.hpp"
#include "buffer_kind.hpp"
#include "communicator_impl.hpp"

namespace strata {

using backend::Algorithm;
using backend::BufferKind;
using backend::CollectiveOp;
using backend::CollectiveRequest;

namespace {

[[noreturn]] void invalid(const char* what, const std::string& why) {
  throw Error(ErrorCode::InvalidArgument, fmt::format("{}: {}", what, why));
}

void checkType(const char* what, DataType type) {
  if (!isKnown(type)) invalid(what, fmt::format("unknown data type {}", static_cast<int>(type)));
}

void checkOp(const char* what, ReduceOp op) {
  if (!isKnown(op)) invalid(what, fmt::format("unknown reduce op {}", static_cast<int>(op)));
}

/// count * typeSize * multiple, or InvalidArgument on overflow.
size_t bytesOf(const char* what, size_t count, DataType type, size_t multiple = 1) {
  size_t ts = sizeOf(type);
  if (count > std::numeric_limits<size_t>::max() / ts / multiple) {
    invalid(what, fmt::format("count {} of {} is too large", count, toString(type)));
  }
  return count * ts * multiple;
}

void checkBuffer(const char* what, const char* name, const void* p, size_t bytes) {
  if (bytes > 0 && p == nullptr) invalid(what, fmt::format("{} is null with a count > 0", name));
  if (bytes > 0 && reinterpret_cast<uintptr_t>(p) > std::numeric_limits<uintptr_t>::max() - bytes) {
    invalid(what, fmt::format("{} wraps around the address space", name));
  }
}

/// send() and recv(): the peer must be another rank, the buffer valid for count elements.
void checkPointToPoint(const char* what, const void* buf, size_t count, DataType type, int peer,
                       int rank, int size) {
  checkType(what, type);
  if (peer < 0 || peer >= size || peer == rank) {
    invalid(what, fmt::format("peer {} is not another rank of this communicator (0..{}, this "
                              "rank is {})",
                              peer, size - 1, rank));
  }
  checkBuffer(what, "buffer", buf, bytesOf(what, count, type));
}

bool overlap(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  if (aBytes == 0 || bBytes == 0) return false;
  auto x = reinterpret_cast<uintptr_t>(a);
  auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + bBytes && y < x + aBytes;
}

/// Host memory on a stream: strata's host algorithms complete before they return, so the call
/// waits for the stream's earlier work and runs without it (strata::hostOrdered).
void orderHostWork(CollectiveRequest& r) {
  if (r.stream.handle && r.sendKind != BufferKind::CudaDevice &&
      r.recvKind != BufferKind::CudaDevice) {
    core::synchronizeStream(r.stream.handle);
    r.stream = Stream{};
  }
}

/// The error of a revoked communicator as the call `what` reports it.
Error inCall(const char* what, const Error& revoked) {
  return Error(revoked.code(), fmt::format("{}: {}", what, revoked.what()), revoked.peer());
}

CollectiveRequest request(CollectiveOp op, const void* send, void* recv, size_t count,
                          DataType type, Stream stream) {
  CollectiveRequest r;
  r.op = op;
  r.send = send;
  r.recv = recv;
  r.count = count;
  r.type = type;
  r.stream = stream;
  r.sendKind = core::classifyBuffer(send);
  r.recvKind = recv == send ? r.sendKind : core::classifyBuffer(recv);
  orderHostWork(r);
  return r;
}

}  // namespace

void Communicator::Impl::run(const CollectiveRequest& r, const char* what) {
  std::lock_guard<std::mutex> lock(mu);
  // This rank's own failure first (its later calls repeat it), then a revoke.
  if (auto revoked = context->revoked(); revoked && !broken) {
    throw inCall(what, *revoked);
  }
  for (size_t i = 0; i < backends.size() && !broken; ++i) broken = backends[i]->asyncError();
  if (broken) {
    throw Error(broken->code(),
                fmt::format("{}: the communicator failed earlier and cannot be used: {}", what,
                            broken->what()),
                broken->peer());
  }
  const core::Candidate& c = select(r, what);  // NotSupported leaves the communicator usable
  last = &c;
  watch::Slot::Active call(slot.get(), what, ++calls);
  try {
    c.algorithm->run(r);
  } catch (const Error& e) {
    if (auto revoked = context->revoked()) {
      // Revoked while it ran (by this rank's other thread or a peer): that is the error, with
      // nothing to diagnose. The call stays reported as failed here: a peer whose own timeout
      // fires later asks, and must see this rank in this call, not in its next one (the stall
      // suite's missing-1m case failed so in stop 45's CI run: rank 1 took rank 0's revoke,
      // went on into a barrier, and rank 2 named it as a rank in that barrier).
      watch::markFailed();
      broken = inCall(what, *revoked);
      throw *broken;
    }
    // A timeout, or a chunk of another operation: ask the other ranks what they are doing and
    // name the one at fault first (bounded by watch.query_timeout). A lost peer is the cause
    // itself, or left a note saying what was (explain).
    broken = explain(e.code() == ErrorCode::PeerLost ? e : watch::diagnose(e));
    leaveNote(*broken);
    afterFailure(*broken);
    throw *broken;
  } catch (const std::exception& e) {
    broken = Error(ErrorCode::Internal, e.what());
    throw;
  }
}

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

std::unique_ptr<Communicator> Communicator::create(const Config& config) {
  std::shared_ptr<Bootstrap> bootstrap = Bootstrap::create(config);
  return create(std::move(bootstrap), config);
}

std::unique_ptr<Communicator> Communicator::create(std::shared_ptr<Bootstrap> bootstrap,
                                                   const Config& config) {
  if (!bootstrap) throw Error(ErrorCode::InvalidArgument, "Communicator::create: null bootstrap");
  auto impl = std::make_unique<Impl>();
  impl->bootstrap = bootstrap;
  impl->rank = bootstrap->rank();
  impl->size = bootstrap->size();
  try {
    impl->context = Context::create(std::move(bootstrap), config);
    impl->loadBackends(config);
  } catch (const Error& e) {
    // A failure of this process (out of descriptors or memory), not of a peer: the others are
    // in the same set-up and would see this rank leave ("closed its bootstrap") or time out;
    // tell them why instead.
    if (e.code() == ErrorCode::SystemError) {
      impl->bootstrap->abort(
          fmt::format("rank {}: Communicator::create failed: {}", impl->rank, e.what()));
    }
    throw;
  }
  impl->resolveForced(config);
  impl->config = config;
  impl->revokeOnError = config::getBool(config, "collectives.revoke_on_error");
  impl->fault->context = impl->context;
  {
    std::lock_guard lk(impl->fault->revokeMu);
    impl->fault->bootstrap = impl->bootstrap.get();
  }
  if (auto scope = bootstrap::scopeOf(impl->bootstrap.get())) {
    impl->scope = scope;
    impl->domain = scope->nextDomain();
    impl->slot = std::make_unique<watch::Slot>(std::move(scope), impl->domain);
    impl->listenRevokes();
  }
  return std::make_unique<Communicator>(std::move(impl));
}

int Communicator::rank() const {
  return impl_->rank;
}
int Communicator::size() const {
  return impl_->size;
}
Bootstrap& Communicator::bootstrap() {
  return *impl_->bootstrap;
}
Context& Communicator::context() {
  return *impl_->context;
}

std::string Communicator::lastAlgorithm() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last ? impl_->last->fullName : std::string();
}

std::optional<Error> Communicator::asyncError() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->broken) return impl_->broken;
  for (const auto& be : impl_->backends) {
    if (auto e = be->asyncError()) {
      impl_->broken = e;
      if (!impl_->context->revoked()) impl_->afterFailure(*e);
      return e;
    }
  }
  if (auto revoked = impl_->context->revoked()) return revoked;
  return std::nullopt;
}

std::string Communicator::lastLaunch() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last ? impl_->last->algorithm->launchShape() : std::string();
}

void* Communicator::allocHost(size_t bytes) {
  return backend::allocSharedHost(bytes);
}

void Communicator::freeHost(void* ptr) {
  backend::freeSharedHost(ptr);
}

std::string Communicator::tuningReport() const {
  std::string out;
  for (const auto& be : impl_->backends) {
    std::string report = be->tuningReport();
    if (report.empty()) continue;
    if (!out.empty()) out += '\n';
    out += report;
    if (out.back() != '\n') out += '\n';
  }
  return out;
}

std::vector<Communicator::AlgorithmInfo> Communicator::algorithms() const {
  std::vector<AlgorithmInfo> out;
  for (auto& be : impl_->backends) {
    std::string kinds;
    for (BufferKind k : be->memoryKinds()) {
      kinds += (kinds.empty() ? "" : ", ") + std::string(backend::toString(k));
    }
    for (Algorithm* a : be->algorithms()) {
      AlgorithmInfo info;
      info.backend = std::string(be->name());
      info.name = std::string(a->name());
      for (CollectiveOp op : a->ops()) info.ops.emplace_back(backend::toString(op));
      info.memory = kinds;
      info.description = a->describe();
      for (CollectiveOp op : a->ops()) {
        const core::OpTable& t = impl_->ops[static_cast<size_t>(op)];
        if (t.forced && t.forced->algorithm == a) {
          info.forcedFor.emplace_back(backend::toString(op));
        }
      }
      out.push_back(std::move(info));
    }
  }
  return out;
}

void Communicator::allReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                             Stream stream) {
  const char* what = "allReduce";
  checkType(what, type);
  checkOp(what, op);
  size_t bytes = bytesOf(what, count, type);
  checkBuffer(what, "send buffer", send, bytes);
  checkBuffer(what, "recv buffer", recv, bytes);
  if (send != recv && overlap(send, bytes, recv, bytes)) {
    invalid(what, "send and recv buffers overlap but are not the same (in place: send == recv)");
  }
  auto r = request(CollectiveOp::AllReduce, send, recv, count, type, stream);
  r.redop = op;
  impl_->run(r, what);
}

void Communicator::allGather(const void* send, void* recv, size_t sendCount, DataType type,
                             Stream stream) {
  const char* what = "allGather";
  checkType(what, type);
  size_t bytes = bytesOf(what, sendCount, type);
  size_t total = bytesOf(what, sendCount, type, static_cast<size_t>(impl_->size));
  checkBuffer(what, "send buffer", send, bytes);
  checkBuffer(what, "recv buffer", recv, total);
  bool inPlace = bytes > 0 && send == static_cast<const char*>(recv) + bytes * impl_->rank;
  if (!inPlace && overlap(send, bytes, recv, total)) {
    invalid(what,
            "send and recv buffers overlap but not in place (in place: send == recv + rank * "
            "sendCount elements)");
  }
  impl_->run(request(CollectiveOp::AllGather, send, recv, sendCount, type, stream), what);
}

void Communicator::reduceScatter(const void* send, void* recv, size_t recvCount, DataType type,
                                 ReduceOp op, Stream stream) {
  const char* what = "reduceScatter";
  checkType(what, type);
  checkOp(what, op);
  size_t bytes = bytesOf(what, recvCount, type);
  size_t total = bytesOf(what, recvCount, type, static_cast<size_t>(impl_->size));
  checkBuffer(what, "send buffer", send, total);
  checkBuffer(what, "recv buffer", recv, bytes);
  bool inPlace = bytes > 0 && recv == static_cast<const char*>(send) + bytes * impl_->rank;
  if (!inPlace && overlap(send, total, recv, bytes)) {
    invalid(what,
            "send and recv buffers overlap but not in place (in place: recv == send + rank * "
            "recvCount elements)");
  }
  auto r = request(CollectiveOp::ReduceScatter, send, recv, recvCount, type, stream);
  r.redop = op;
  impl_->run(r, what);
}

void Communicator::broadcast(const void* send, void* recv, size_t count, DataType type, int root,
                             Stream stream) {
  const char* what = "broadcast";
  checkType(what, type);
  if (root < 0 || root >= impl_->size) {
    invalid(what, fmt::format("root {} is not a rank of this communicator (0..{})", root,
                              impl_->size - 1));
  }
  size_t bytes = bytesOf(what, count, type);
  checkBuffer(what, "recv buffer", recv, bytes);
  if (impl_->rank == root) {
    checkBuffer(what, "send buffer", send, bytes);
    if (send != recv && overlap(send, bytes, recv, bytes)) {
      invalid(what, "send and recv buffers overlap but are not the same (in place: send == recv)");
    }
  }
  // send is read on the root only: elsewhere it may be anything, even null.
  auto r = request(CollectiveOp::Broadcast, impl_->rank == root ? send : recv, recv, count, type,
                   stream);
  r.send = send;
  r.root = root;
  impl_->run(r, what);
}

void Communicator::allToAll(const void* send, void* recv, size_t countPerRank, DataType type,
                            Stream stream) {
  const char* what = "allToAll";
  checkType(what, type);
  size_t total = bytesOf(what, countPerRank, type, static_cast<size_t>(impl_->size));
  checkBuffer(what, "send buffer", send, total);
  checkBuffer(what, "recv buffer", recv, total);
  if (overlap(send, total, recv, total)) {
    invalid(what, "send and recv buffers overlap (allToAll has no in-place form)");
  }
  impl_->run(request(CollectiveOp::AllToAll, send, recv, countPerRank, type, stream), what);
}

void Communicator::send(const void* buf, size_t count, DataType type, int peer, Stream stream) {
  const char* what = "send";
  checkPointToPoint(what, buf, count, type, peer, impl_->rank, impl_->size);
  auto r = request(CollectiveOp::Send, buf, nullptr, count, type, stream);
  r.recvKind = r.sendKind;
  r.peer = peer;
  impl_->run(r, what);
}

void Communicator::recv(void* buf, size_t count, DataType type, int peer, Stream stream) {
  const char* what = "recv";
  checkPointToPoint(what, buf, count, type, peer, impl_->rank, impl_->size);
  auto r = request(CollectiveOp::Recv, nullptr, buf, count, type, stream);
  r.sendKind = r.recvKind;
  r.peer = peer;
  impl_->run(r, what);
}

void Communicator::sendRecv(std::span<const PointToPoint> ops, Stream stream) {
  const char* what = "sendRecv";
  CollectiveRequest r;
  r.op = CollectiveOp::SendRecv;
  r.stream = stream;
  r.batch = ops;
  bool any = false, device = false, host = false;
  for (size_t i = 0; i < ops.size(); ++i) {
    const PointToPoint& p = ops[i];
    if (p.kind != PointToPoint::Kind::Send && p.kind != PointToPoint::Kind::Recv) {
      invalid(what, fmt::format("item {}: unknown kind {}", i, static_cast<int>(p.kind)));
    }
    const bool isSend = p.kind == PointToPoint::Kind::Send;
    const void* buf = isSend ? p.send : p.recv;
    try {
      checkPointToPoint(isSend ? "a send" : "a receive", buf, p.count, p.type, p.peer, impl_->rank,
                        impl_->size);
    } catch (const Error& e) {
      invalid(what, fmt::format("item {} ({})", i, e.what()));
    }
    if (p.count == 0) continue;
    const BufferKind kind = core::classifyBuffer(buf);
    (kind == BufferKind::CudaDevice ? device : host) = true;
    if (!any) r.sendKind = r.recvKind = kind;
    if (kind != r.sendKind) r.recvKind = kind;
    any = true;
  }
  if (!any) return;  // nothing moves (the peers' matching items are empty too)
  if (device && host) {
    throw Error(ErrorCode::NotSupported,
                "sendRecv: the batch mixes CUDA device memory with host memory; issue the "
                "device items and the host items as two batches");
  }
  orderHostWork(r);
  impl_->run(r, what);
}

}  // namespace strata
