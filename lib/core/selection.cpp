// Algorithm selection: the candidates of each op from the loaded collectives backends
// (<strata/backend/collectives.hpp>), an algorithm forced by the configuration, and the choice
// per call, with the NotSupported text that says why nothing can run a call.

#include <algorithm>
#include <iterator>
#include <set>

#include <fmt/format.h>

#include <strata/backend/module.hpp>

#include "base/config_keys.hpp"
#include "base/strings.hpp"
#include "bootstrap/registry.hpp"
#include "communicator_impl.hpp"

namespace strata {

using backend::Algorithm;
using backend::BufferKind;
using backend::CollectiveOp;
using backend::CollectiveRequest;
using core::Candidate;
using core::OpTable;

namespace {

constexpr CollectiveOp kOps[] = {CollectiveOp::AllReduce,     CollectiveOp::AllGather,
                                 CollectiveOp::ReduceScatter, CollectiveOp::Broadcast,
                                 CollectiveOp::AllToAll,      CollectiveOp::Send,
                                 CollectiveOp::Recv,          CollectiveOp::SendRecv};

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
    case CollectiveOp::SendRecv:
      return "collectives.sendrecv.algorithm";
  }
  return "collectives.algorithm";
}

/// Collectives modules auto tries (each is skipped quietly when absent).
const char* const kKnownCollectivesModules[] = {"cuda"};

uint32_t kindBit(BufferKind k) {
  return 1u << static_cast<unsigned>(k);
}

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
    if (r.op == CollectiveOp::SendRecv) {
      return fmt::format("{} ({} sends and receives, {} memory{})", what, r.batch.size(), kinds,
                         r.stream.handle ? ", on a CUDA stream" : "");
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

}  // namespace strata
