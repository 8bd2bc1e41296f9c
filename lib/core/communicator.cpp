// The Communicator: argument checks, memory classification, algorithm selection over the
// collectives backends (<strata/backend/collectives.hpp>), then the chosen algorithm.

#include <strata/communicator.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include <strata/backend/collectives.hpp>
#include <strata/backend/module.hpp>
#include <strata/error.hpp>
#include <strata/transport.hpp>

#include "base/config_keys.hpp"
#include "base/process.hpp"
#include "base/strings.hpp"
#include "base/watch_calls.hpp"
#include "bootstrap/registry.hpp"
#include "bootstrap/watched.hpp"
#include "buffer_kind.hpp"

namespace strata {

namespace {

using backend::Algorithm;
using backend::BufferKind;
using backend::CollectiveOp;
using backend::CollectiveRequest;
using backend::CollectivesBackend;

constexpr CollectiveOp kOps[] = {CollectiveOp::AllReduce,     CollectiveOp::AllGather,
                                 CollectiveOp::ReduceScatter, CollectiveOp::Broadcast,
                                 CollectiveOp::AllToAll,      CollectiveOp::Send,
                                 CollectiveOp::Recv};
constexpr size_t kOpSlots = 8;  // indexed by CollectiveOp's value

/// The per-op key that forces an algorithm ("collectives.allreduce.algorithm").
std::string_view opKey(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::AllReduce:
      return "collectives.allreduce.algorithm";
    case CollectiveOp::AllGather:
      return "collectives.allgather.algorithm";
    case CollectiveOp::ReduceScatter:
      return "collectives.reducescatter.algorithm";
    case CollectiveOp::Broadcast:
      return "collectives.broadcast.algorithm";
    case CollectiveOp::AllToAll:
      return "collectives.alltoall.algorithm";
    case CollectiveOp::Send:
    case CollectiveOp::Recv:
      return "collectives.sendrecv.algorithm";
  }
  return "collectives.algorithm";
}

/// Bootstrap tag of the note a rank whose call failed because of a peer leaves to the other
/// ranks of its host (lib/transport's records use 0x5354xxxx).
constexpr int kTagFailureNote = 0x53430001;
/// Bytes of the note (recv needs the size): the error's text, cut to fit.
constexpr size_t kFailureNoteBytes = 2048;

/// Collectives modules auto tries (each is skipped quietly when absent).
const char* const kKnownCollectivesModules[] = {"cuda"};

uint32_t kindBit(BufferKind k) {
  return 1u << static_cast<unsigned>(k);
}

struct Candidate {
  Algorithm* algorithm = nullptr;
  CollectivesBackend* backend = nullptr;
  uint32_t kinds = 0;    ///< the backend's memory kinds (kindBit)
  std::string fullName;  ///< "host/twoshot"
};

struct OpTable {
  std::vector<Candidate> candidates;  ///< in selection order
  const Candidate* forced = nullptr;
  std::string forcedBy;  ///< "collectives.algorithm = twoshot"
};

}  // namespace

struct Communicator::Impl {
  std::shared_ptr<Bootstrap> bootstrap;
  std::shared_ptr<Context> context;
  int rank = 0;
  int size = 1;
  // Declared after context: destroyed before it.
  std::vector<std::unique_ptr<CollectivesBackend>> backends;
  std::array<OpTable, kOpSlots> ops;
  /// Why the cuda module is not loaded (for the NotSupported message on device memory).
  std::string cudaMissing;
  /// Held for a whole call: broken and last are read and written under it.
  mutable std::mutex mu;
  /// Set by the first error while data moved: the pair counters may be out of step, so every
  /// later call fails at once instead of mixing up data.
  mutable std::optional<Error> broken;  // asyncError() const may set it
  const Candidate* last = nullptr;      ///< what the last call chose
  /// The watch's record of its calls (base/watch_calls.hpp): this communicator's label and call
  /// count.
  std::unique_ptr<watch::Slot> slot;
  uint64_t calls = 0;

  void loadBackends(const Config& config);
  void resolveForced(const Config& config);
  const Candidate& select(const CollectiveRequest& r, const char* what) const;
  void run(const CollectiveRequest& r, const char* what);
  void leaveNote(const Error& e) const noexcept;
  Error explain(const Error& e) const;
};

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
  return r;
}

}  // namespace

void Communicator::Impl::loadBackends(const Config& config) {
  backend::CollectivesInit init;
  init.context = context;
  init.config = &config;
  init.topology.rank = rank;
  init.topology.size = size;
  init.topology.hosts = context->hostGroups();
  auto host = bootstrap::findModule(backend::ModuleKind::Collectives, "host", config);
  if (!host.info) throw Error(ErrorCode::Internal, "the built-in host collectives are missing");
  backends.push_back(host.info->createCollectives(init));

  std::string list = config::getString(config, "collectives.modules");
  const bool automatic = list == "auto";
  std::vector<std::string> names;
  if (automatic) {
    names.assign(std::begin(kKnownCollectivesModules), std::end(kKnownCollectivesModules));
  } else if (list != "none") {
    for (auto item : strings::split(list)) {
      auto n = strings::trim(item);
      if (!n.empty()) names.emplace_back(n);
    }
  }
  for (const auto& name : names) {
    auto m = bootstrap::findModule(backend::ModuleKind::Collectives, name, config);
    // Creating a backend is collective: every rank must have the module, or none creates it.
    std::vector<uint8_t> found(static_cast<size_t>(size));
    found[rank] = m.info != nullptr;
    bootstrap->allGather(found.data(), 1);
    int without = -1;
    for (int r = 0; r < size && without < 0; ++r) {
      if (!found[r]) without = r;
    }
    if (without >= 0) {
      std::string why =
          without == rank ? m.error : fmt::format("rank {} could not load it", without);
      if (name == "cuda") cudaMissing = why;
      if (automatic) continue;
      throw Error(
          ErrorCode::NotSupported,
          fmt::format("collectives.modules names {}, which is not available: {}", name, why));
    }
    backends.push_back(m.info->createCollectives(init));
  }
}

void Communicator::Impl::resolveForced(const Config& config) {
  for (auto& be : backends) {
    uint32_t kinds = 0;
    for (BufferKind k : be->memoryKinds()) kinds |= kindBit(k);
    for (Algorithm* a : be->algorithms()) {
      for (CollectiveOp op : a->ops()) {
        ops[static_cast<size_t>(op)].candidates.push_back(
            {a, be.get(), kinds, fmt::format("{}/{}", be->name(), a->name())});
      }
    }
  }
  auto matches = [](const Candidate& c, const std::string& name) {
    return c.algorithm->name() == name || c.fullName == name;
  };
  auto choices = [&](CollectiveOp op) {
    std::string out;
    for (const auto& c : ops[static_cast<size_t>(op)].candidates) {
      out += (out.empty() ? "" : ", ") + c.fullName;
    }
    return out;
  };
  std::string global = config::getString(config, "collectives.algorithm");
  // The global name must exist for some op, whether or not per-op keys override it there.
  bool globalKnown = global == "auto";
  for (CollectiveOp op : kOps) {
    for (const auto& c : ops[static_cast<size_t>(op)].candidates) globalKnown |= matches(c, global);
  }
  for (CollectiveOp op : kOps) {
    OpTable& t = ops[static_cast<size_t>(op)];
    std::string key(opKey(op));
    std::string name = config::getString(config, key);
    bool perOp = !name.empty() && name != "auto";
    if (!perOp) {
      if (global == "auto" || !name.empty()) continue;  // per-op "auto" overrides the global key
      name = global;
    }
    const Candidate* found = nullptr;
    for (const auto& c : t.candidates) {
      if (matches(c, name)) {
        found = &c;
        break;
      }
    }
    if (!found) {
      if (!perOp) continue;  // the global key applies to the ops that have that name
      throw Error(ErrorCode::InvalidConfig,
                  fmt::format("{} = {}: no loaded collectives backend has an algorithm of that "
                              "name for {} (choices: auto, {})",
                              key, name, backend::toString(op), choices(op)));
    }
    t.forced = found;
    t.forcedBy = fmt::format("{} = {}", perOp ? key : "collectives.algorithm", name);
  }
  if (!globalKnown) {
    std::set<std::string> all;
    for (CollectiveOp op : kOps) {
      for (const auto& c : ops[static_cast<size_t>(op)].candidates) {
        all.insert(std::string(c.algorithm->name()));
      }
    }
    std::string names;
    for (const auto& n : all) names += (names.empty() ? "" : ", ") + n;
    throw Error(ErrorCode::InvalidConfig,
                fmt::format("collectives.algorithm = {}: no loaded collectives backend has an "
                            "algorithm of that name (choices: auto, {}; strata-info --algorithms "
                            "says what each accepts)",
                            global, names));
  }
}

namespace {

/// Why the candidate cannot run the request (empty: it can): its backend does not serve the
/// buffers' memory, or the algorithm says why not.
std::string whyNot(const Candidate& c, const CollectiveRequest& r) {
  for (BufferKind k : {r.sendKind, r.recvKind}) {
    if ((c.kinds & kindBit(k)) == 0) {
      return fmt::format("backend {} does not serve {} memory", c.backend->name(),
                         backend::toString(k));
    }
  }
  return c.algorithm->unsuitable(r);
}

}  // namespace

const Candidate& Communicator::Impl::select(const CollectiveRequest& r, const char* what) const {
  const OpTable& t = ops[static_cast<size_t>(r.op)];
  const uint32_t need = kindBit(r.sendKind) | kindBit(r.recvKind);
  auto describeCall = [&] {
    std::string kinds(backend::toString(r.recvKind));
    if (r.send && r.recv && r.sendKind != r.recvKind) {
      kinds = fmt::format("send {}, recv {}", backend::toString(r.sendKind),
                          backend::toString(r.recvKind));
    } else if (!r.recv) {
      kinds = backend::toString(r.sendKind);
    }
    return fmt::format("{} ({} elements of {}, {} memory{})", what, r.count, toString(r.type),
                       kinds, r.stream.handle ? ", on a CUDA stream" : "");
  };
  if (t.forced) {
    std::string why = whyNot(*t.forced, r);
    if (!why.empty()) {
      throw Error(ErrorCode::NotSupported,
                  fmt::format("{}: {} (forced by {}) cannot run it: {}", describeCall(),
                              t.forced->fullName, t.forcedBy, why));
    }
    return *t.forced;
  }
  const Candidate* fallback = nullptr;
  for (const auto& c : t.candidates) {
    if ((c.kinds & need) != need || !c.algorithm->unsuitable(r).empty()) continue;
    if (c.algorithm->prefers(r)) return c;
    if (!fallback) fallback = &c;
  }
  if (fallback) return *fallback;
  // Nothing can run it: say why, the memory first.
  if ((r.sendKind == BufferKind::CudaDevice || r.recvKind == BufferKind::CudaDevice)) {
    bool served = false;
    for (const auto& c : t.candidates) served |= (c.kinds & need) == need;
    if (!served) {
      throw Error(
          ErrorCode::NotSupported,
          fmt::format("{}: no loaded collectives backend serves CUDA device memory; "
                      "install strata's CUDA collectives module (strata-collectives-"
                      "cuda.so, built when meson finds the CUDA toolkit) on the module "
                      "path{}",
                      describeCall(),
                      cudaMissing.empty() ? std::string() : fmt::format(" ({})", cudaMissing)));
    }
  }
  std::string text;
  std::set<std::string> distinct;
  for (const auto& c : t.candidates) {
    std::string why = whyNot(c, r);
    text += fmt::format("{}{}: {}", text.empty() ? "" : "; ", c.fullName, why);
    distinct.insert(std::move(why));
  }
  // One reason when every algorithm gave the same (a stream on host memory, say).
  if (distinct.size() == 1) text = *distinct.begin();
  throw Error(ErrorCode::NotSupported,
              fmt::format("{}: no algorithm can run it ({})", describeCall(), text));
}

void Communicator::Impl::run(const CollectiveRequest& r, const char* what) {
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < backends.size() && !broken; ++i) broken = backends[i]->asyncError();
  if (broken) {
    throw Error(broken->code(),
                fmt::format("{}: the communicator failed earlier and cannot be used: {}", what,
                            broken->what()),
                broken->peer());
  }
  const Candidate& c = select(r, what);  // NotSupported leaves the communicator usable
  last = &c;
  watch::Slot::Active call(slot.get(), what, ++calls);
  try {
    c.algorithm->run(r);
  } catch (const Error& e) {
    // A timeout, or a chunk of another operation: ask the other ranks what they are doing and
    // name the one at fault first (bounded by watch.query_timeout). A lost peer is the cause
    // itself, or left a note saying what was (explain).
    broken = explain(e.code() == ErrorCode::PeerLost ? e : watch::diagnose(e));
    leaveNote(*broken);
    throw *broken;
  } catch (const std::exception& e) {
    broken = Error(ErrorCode::Internal, e.what());
    throw;
  }
}

// A rank whose call fails because of a peer (Timeout, PeerLost) usually exits soon after. The
// other ranks of its host then see only that a rank of their host exited (shm) and would name it,
// not the cause: a rank of another host whose link went down (tests/stress/net_faults.sh). So
// the failing rank leaves them a note on the bootstrap, whose connections inside the host still
// work, and a rank that lost a peer of its host reads that peer's note into its own error.
void Communicator::Impl::leaveNote(const Error& e) const noexcept {
  if ((e.code() != ErrorCode::PeerLost && e.code() != ErrorCode::Timeout &&
       e.code() != ErrorCode::ProtocolError) ||
      e.peer() < 0) {
    return;
  }
  // "root N\n<who is at fault>\n<this rank's error>": N is the rank that diagnose() found at
  // fault (-1: none), so that a rank reading the note can name it first as well.
  std::array<char, kFailureNoteBytes> note{};
  const watch::Verdict v = watch::lastVerdict();
  std::string text =
      fmt::format("root {}\n{}\nrank {} failed first: {}", v.culprit, v.text, rank, e.what());
  std::memcpy(note.data(), text.data(), std::min(text.size(), note.size() - 1));
  for (int p = 0; p < size; ++p) {
    // The peer of the error is left out when it is the one at fault (or nothing more is known):
    // not when the diagnosis found another rank, or this one (a mismatched call), at fault.
    if (p == rank || (p == e.peer() && (v.culprit < 0 || v.culprit == p))) continue;
    try {
      // Small and on a connection the context's set-up opened: the kernel takes it at once.
      if (context->sameHost(p)) bootstrap->send(p, kTagFailureNote, note.data(), note.size());
    } catch (const std::exception&) {
      // That rank is gone too; nothing to tell.
    }
  }
}

Error Communicator::Impl::explain(const Error& e) const {
  const int q = e.peer();
  if (e.code() != ErrorCode::PeerLost || q < 0 || q == rank || q >= size) return e;
  try {
    if (!context->sameHost(q)) return e;
    // Only a process that is gone: its bootstrap connection is closed, so the receive ends at
    // once with its note (sent before it exited) or with PeerLost. A live one may not send any.
    const int32_t pid = context->pid(q);
    if (pid <= 0 || !process::gone(pid)) return e;
    std::array<char, kFailureNoteBytes> note{};
    bootstrap->recv(q, kTagFailureNote, note.data(), note.size());
    note.back() = '\0';
    std::string_view all(note.data());
    int root = -1;
    std::string verdict, first(all);
    if (all.rfind("root ", 0) == 0) {
      auto nl1 = all.find('\n');
      auto nl2 = nl1 == std::string_view::npos ? nl1 : all.find('\n', nl1 + 1);
      if (nl2 != std::string_view::npos) {
        root = std::atoi(std::string(all.substr(5, nl1 - 5)).c_str());
        verdict = all.substr(nl1 + 1, nl2 - nl1 - 1);
        first = all.substr(nl2 + 1);
      }
    }
    if (root >= 0 && root < size && !verdict.empty()) {
      // The rank that exited had found who was at fault: say that first.
      if (root == q) {
        return Error(e.code(),
                     fmt::format("{} (as rank {} found before it failed and exited). This rank "
                                 "({}): {}",
                                 verdict, q, rank, e.what()),
                     root);
      }
      return Error(e.code(),
                   fmt::format("{} (found by rank {} before it failed and exited). This rank "
                               "({}): {} ({})",
                               verdict, q, rank, e.what(), first),
                   root);
    }
    return Error(e.code(), fmt::format("{} ({})", e.what(), first), q);
  } catch (const std::exception&) {
    return e;  // no note: it exited without failing a call (killed, or another cause)
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
  if (auto scope = bootstrap::scopeOf(impl->bootstrap.get())) {
    std::string domain = scope->nextDomain();
    impl->slot = std::make_unique<watch::Slot>(std::move(scope), std::move(domain));
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
      return e;
    }
  }
  return std::nullopt;
}

std::string Communicator::lastLaunch() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last ? impl_->last->algorithm->launchShape() : std::string();
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
        const OpTable& t = impl_->ops[static_cast<size_t>(op)];
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

}  // namespace strata
