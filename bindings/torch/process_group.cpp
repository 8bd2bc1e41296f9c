#include "process_group.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <utility>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <strata/bootstrap.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>

namespace strata::torchbind {
namespace {

constexpr const char* kSupportedTypes =
    "float32, float64, float16, bfloat16, int8, uint8, int32, int64 and bool";

std::string typeName(const at::Tensor& t) {
  return std::string(c10::toString(t.scalar_type()));
}

/// The strata type of a tensor, or a RuntimeError at the call naming what is supported.
DataType typeOf(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined(), "strata: ", what, ": undefined tensor");
  TORCH_CHECK(!t.is_sparse(), "strata: ", what, ": sparse tensors are not supported");
  TORCH_CHECK(!t.is_cuda(), "strata: ", what,
              ": CUDA tensors need a PyTorch built with CUDA and strata_torch built against it; "
              "this strata_torch was built against a PyTorch without CUDA (Debian's), so it "
              "serves CPU tensors only (docs/pytorch.md)");
  TORCH_CHECK(t.device().is_cpu(), "strata: ", what, ": tensors on ", t.device().str(),
              " are not supported (CPU tensors only)");
  switch (t.scalar_type()) {
    case at::kFloat:
      return DataType::Float32;
    case at::kDouble:
      return DataType::Float64;
    case at::kHalf:
      return DataType::Float16;
    case at::kBFloat16:
      return DataType::BFloat16;
    case at::kChar:
      return DataType::Int8;
    case at::kByte:
      return DataType::Uint8;
    case at::kBool:
      return DataType::Uint8;
    case at::kInt:
      return DataType::Int32;
    case at::kLong:
      return DataType::Int64;
    default:
      break;
  }
  TORCH_CHECK(false, "strata: ", what, ": tensors of type ", typeName(t),
              " are not supported; strata supports ", kSupportedTypes);
}

/// The strata reduction for a torch op on this tensor type. bool reduces as uint8 with SUM as
/// logical or (MAX) and PRODUCT as logical and (MIN), as ProcessGroupNCCL does.
ReduceOp reduceOpOf(const c10d::ReduceOp& op, const at::Tensor& t, const char* what) {
  const bool isBool = t.scalar_type() == at::kBool;
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return isBool ? ReduceOp::Max : ReduceOp::Sum;
    case c10d::ReduceOp::PRODUCT:
      return isBool ? ReduceOp::Min : ReduceOp::Prod;
    case c10d::ReduceOp::MIN:
      return ReduceOp::Min;
    case c10d::ReduceOp::MAX:
      return ReduceOp::Max;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK(!isBool, "strata: ", what, ": AVG is not defined for bool tensors");
      return ReduceOp::Avg;
    default:
      break;
  }
  static const char* names[] = {"SUM",  "AVG", "PRODUCT", "MIN",        "MAX",
                                "BAND", "BOR", "BXOR",    "PREMUL_SUM", "UNUSED"};
  const auto index = static_cast<size_t>(op.op_);
  TORCH_CHECK(false, "strata: ", what, ": ReduceOp.", index < 10 ? names[index] : "?",
              " is not supported; strata supports SUM, PRODUCT, MIN, MAX and AVG");
}

const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* what) {
  TORCH_CHECK(tensors.size() == 1, "strata: ", what, " takes one tensor per call (got ",
              tensors.size(), "); strata serves one device per process");
  return tensors[0];
}

void checkRoot(int64_t root, int size, const char* what) {
  TORCH_CHECK(root >= 0 && root < size, "strata: ", what, ": root rank ", root, " is not in 0..",
              size - 1);
}

void checkSameType(const at::Tensor& a, const at::Tensor& b, const char* what) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "strata: ", what, ": tensors of types ",
              typeName(a), " and ", typeName(b), " cannot be mixed");
}

/// Runs f on a contiguous version of t (t itself when it already is one) and copies the result
/// back when f wrote to a copy.
template <typename F>
void withContiguous(at::Tensor& t, bool writes, F&& f) {
  if (t.is_contiguous()) {
    f(t);
    return;
  }
  at::Tensor c = t.contiguous();
  f(c);
  if (writes) t.copy_(c);
}

void* dataOf(at::Tensor& t) {
  return t.numel() == 0 ? nullptr : t.data_ptr();
}
size_t countOf(const at::Tensor& t) {
  return static_cast<size_t>(t.numel());
}

/// A strata::Error as the std::runtime_error Python sees (RuntimeError), with what a user needs.
std::exception_ptr translate(const Error& e) {
  std::string msg = std::string("strata: ") + e.what();
  if (e.code() == ErrorCode::Timeout) {
    msg += " (strata_torch sets transport.timeout from init_process_group(timeout=...))";
  }
  return std::make_exception_ptr(std::runtime_error(msg));
}

bool breaksCommunicator(ErrorCode code) {
  return code != ErrorCode::InvalidArgument && code != ErrorCode::NotSupported;
}

std::string freshSecret() {
  std::random_device rd;
  std::ostringstream s;
  for (int i = 0; i < 8; ++i) {
    char buf[9];
    std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(rd()));
    s << buf;
  }
  return s.str();
}

std::vector<uint8_t> bytesOf(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string stringOf(const std::vector<uint8_t>& b) {
  return {b.begin(), b.end()};
}

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream s;
  s << static_cast<double>(ms.count()) / 1000.0;  // "60", "0.5"
  return s.str();
}

// The header strata puts in front of every torch send: torch matches a recv by tag, strata
// delivers in order, so the receiver checks that what arrives is what it waits for.
struct P2pHeader {
  int64_t magic = 0x73747261746170LL;  // "stratap"
  int64_t tag = 0;
  int64_t count = 0;
  int64_t type = 0;
};

}  // namespace

WorkStrata::WorkStrata(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
}

void WorkStrata::complete(std::exception_ptr error) {
  // The future first: a caller that returns from wait() may read get_future().value() at once.
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
}

ProcessGroupStrata::ProcessGroupStrata(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                       int size, std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), store_(store), timeout_(timeout) {
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "strata: rank ", rank, " of ", size,
              " is not a valid process group member");
  TORCH_CHECK(timeout.count() > 0, "strata: the timeout must be positive");
  Config config = Config::load();
  const std::string secs = seconds(timeout);
  config.set("bootstrap.timeout", secs)
      .set("bootstrap.connect_timeout", secs)
      .set("transport.timeout", secs);

  // Who is on this host: every rank's host name, through the store (N reads per rank).
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "unknown");
  store_->set("strata/host/" + std::to_string(rank), bytesOf(host));
  int localRank = 0, localSize = 0;
  for (int r = 0; r < size; ++r) {
    if (stringOf(store_->get("strata/host/" + std::to_string(r))) == host) {
      if (r < rank) ++localRank;
      ++localSize;
    }
  }

  ExplicitLaunch launch{rank, size, localRank, localSize, "", ""};
  std::shared_ptr<Bootstrap> bootstrap;
  try {
    if (size == 1) {
      bootstrap = createTcpBootstrap(launch, config);
    } else if (rank == 0) {
      // env:// names rank 0's host in MASTER_ADDR: listen on the interface that reaches it.
      const char* masterAddr = std::getenv("MASTER_ADDR");
      RendezvousListener listener(config, masterAddr ? masterAddr : "");
      launch.root = listener.address();
      launch.secret = freshSecret();
      store_->set("strata/secret", bytesOf(launch.secret));
      store_->set("strata/root", bytesOf(launch.root));
      bootstrap = createTcpBootstrap(launch, config, &listener);
    } else {
      launch.secret = stringOf(store_->get("strata/secret"));
      launch.root = stringOf(store_->get("strata/root"));
      bootstrap = createTcpBootstrap(launch, config);
    }
    root_ = launch.root;
    comm_ = Communicator::create(std::move(bootstrap), config);
  } catch (const Error& e) {
    throw std::runtime_error(std::string("strata: creating the process group failed on rank ") +
                             std::to_string(rank) + ": " + e.what());
  }
  worker_ = std::thread([this] { workerLoop(); });
}

ProcessGroupStrata::~ProcessGroupStrata() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::string ProcessGroupStrata::describe() const {
  std::ostringstream s;
  s << "strata rank " << rank_ << " of " << size_ << ", root " << (root_.empty() ? "-" : root_)
    << ", timeout " << seconds(timeout_) << " s";
  return s.str();
}

std::string ProcessGroupStrata::lastAlgorithm() const {
  std::lock_guard lock(mu_);
  return lastAlgorithm_;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::enqueue(c10d::OpType type,
                                                           std::vector<at::Tensor> outputs,
                                                           std::function<void()> run, Kind kind) {
  auto work = c10::make_intrusive<WorkStrata>(rank_, type, std::move(outputs));
  {
    std::lock_guard lock(mu_);
    ++sequence_;
    if (coalescing_) {
      held_.push_back(Item{work, std::move(run), kind});
      return work;
    }
    queue_.push_back(Item{work, std::move(run), kind});
  }
  cv_.notify_all();
  return work;
}

void ProcessGroupStrata::startCoalescing() {
  std::lock_guard lock(mu_);
  TORCH_CHECK(!coalescing_, "strata: startCoalescing while already coalescing");
  coalescing_ = true;
}

void ProcessGroupStrata::endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>&) {
  {
    std::lock_guard lock(mu_);
    coalescing_ = false;
    for (Item& item : held_) queue_.push_back(std::move(item));
    held_.clear();
  }
  cv_.notify_all();
}

void ProcessGroupStrata::runItem(Item& item) {
  std::exception_ptr error;
  {
    std::lock_guard lock(mu_);
    error = broken_;
  }
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(std::runtime_error(
          std::string("strata: the process group is unusable after an earlier error: ") +
          e.what()));
    }
  } else {
    try {
      item.run();
    } catch (const Error& e) {
      error = translate(e);
      if (breaksCommunicator(e.code())) {
        std::lock_guard lock(mu_);
        if (!broken_) broken_ = error;
      }
    } catch (const std::exception& e) {
      error = std::current_exception();
    }
  }
  if (!error) {
    std::string algorithm = comm_->lastAlgorithm();
    std::lock_guard lock(mu_);
    lastAlgorithm_ = std::move(algorithm);
  }
  item.work->complete(error);
}

void ProcessGroupStrata::workerLoop() {
  for (;;) {
    std::vector<Item> batch;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left: pending work is never dropped
      // A run of point-to-point calls at the head runs sends first (a host send never waits for
      // the receiver), so isend/irecv pairs issued as recv-then-send on both sides (as
      // batch_isend_irecv does) do not wait on each other. Order per peer and direction holds.
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
      if (batch.front().kind != Kind::Collective) {
        while (!queue_.empty() && queue_.front().kind != Kind::Collective) {
          batch.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
      }
    }
    std::stable_partition(batch.begin(), batch.end(),
                          [](const Item& i) { return i.kind != Kind::Recv; });
    for (Item& item : batch) runItem(item);
  }
}

// --- collectives ------------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  at::Tensor t = single(tensors, "broadcast");
  const DataType type = typeOf(t, "broadcast");
  checkRoot(opts.rootRank, size_, "broadcast");
  TORCH_CHECK(opts.rootTensor == 0, "strata: broadcast: rootTensor must be 0");
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(c10d::OpType::BROADCAST, {t}, [this, t, type, root]() mutable {
    withContiguous(t, rank_ != root, [&](at::Tensor& c) {
      comm_->broadcast(dataOf(c), dataOf(c), countOf(c), type, root);
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  at::Tensor t = single(tensors, "allreduce");
  const DataType type = typeOf(t, "allreduce");
  const ReduceOp op = reduceOpOf(opts.reduceOp, t, "allreduce");
  return enqueue(c10d::OpType::ALLREDUCE, {t}, [this, t, type, op]() mutable {
    withContiguous(t, true, [&](at::Tensor& c) {
      comm_->allReduce(dataOf(c), dataOf(c), countOf(c), type, op);
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "strata: allreduce_coalesced: no tensors");
  std::vector<std::pair<DataType, ReduceOp>> kinds;
  for (const auto& t : tensors) {
    kinds.emplace_back(typeOf(t, "allreduce_coalesced"),
                       reduceOpOf(opts.reduceOp, t, "allreduce_coalesced"));
  }
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, tensors, [this, tensors, kinds]() mutable {
    for (size_t i = 0; i < tensors.size(); ++i) {
      withContiguous(tensors[i], true, [&](at::Tensor& c) {
        comm_->allReduce(dataOf(c), dataOf(c), countOf(c), kinds[i].first, kinds[i].second);
      });
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  at::Tensor t = single(tensors, "reduce");
  const DataType type = typeOf(t, "reduce");
  const ReduceOp op = reduceOpOf(opts.reduceOp, t, "reduce");
  checkRoot(opts.rootRank, size_, "reduce");
  TORCH_CHECK(opts.rootTensor == 0, "strata: reduce: rootTensor must be 0");
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(c10d::OpType::REDUCE, {t}, [this, t, type, op, root]() mutable {
    // Only root's tensor changes (as with Gloo): the others reduce into a scratch copy.
    if (rank_ == root) {
      withContiguous(t, true, [&](at::Tensor& c) {
        comm_->allReduce(dataOf(c), dataOf(c), countOf(c), type, op);
      });
    } else {
      at::Tensor c = t.contiguous().clone();
      comm_->allReduce(dataOf(c), dataOf(c), countOf(c), type, op);
    }
  });
}

void ProcessGroupStrata::allGatherInto(const at::Tensor& in, DataType type,
                                       const std::function<at::Tensor&(int)>& out) {
  at::Tensor src = in.contiguous();
  const int64_t n = src.numel();
  at::Tensor flat = at::empty({static_cast<int64_t>(size_) * n}, src.options());
  comm_->allGather(dataOf(src), dataOf(flat), countOf(src), type);
  for (int r = 0; r < size_; ++r) {
    at::Tensor& o = out(r);
    o.copy_(flat.narrow(0, r * n, n).view(o.sizes()));
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  at::Tensor in = single(inputs, "allgather");
  const DataType type = typeOf(in, "allgather");
  TORCH_CHECK(outputs.size() == 1, "strata: allgather takes one output list (got ", outputs.size(),
              ")");
  std::vector<at::Tensor> outs = outputs[0];
  TORCH_CHECK(static_cast<int>(outs.size()) == size_, "strata: allgather: the output list has ",
              outs.size(), " tensors; the group has ", size_, " ranks");
  for (const auto& o : outs) {
    typeOf(o, "allgather");
    checkSameType(o, in, "allgather");
    TORCH_CHECK(o.numel() == in.numel(), "strata: allgather: an output tensor has ", o.numel(),
                " elements, the input ", in.numel());
  }
  return enqueue(c10d::OpType::ALLGATHER, outs, [this, in, outs, type]() mutable {
    allGatherInto(in, type, [&](int r) -> at::Tensor& { return outs[static_cast<size_t>(r)]; });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::_allgather_base(at::Tensor& output,
                                                                   at::Tensor& input,
                                                                   const c10d::AllgatherOptions&) {
  const DataType type = typeOf(input, "_allgather_base");
  typeOf(output, "_allgather_base");
  checkSameType(output, input, "_allgather_base");
  TORCH_CHECK(output.numel() == static_cast<int64_t>(size_) * input.numel(),
              "strata: _allgather_base: the output has ", output.numel(),
              " elements; it needs world size (", size_, ") times the input's ", input.numel());
  at::Tensor out = output, in = input;
  return enqueue(c10d::OpType::_ALLGATHER_BASE, {out}, [this, out, in, type]() mutable {
    at::Tensor src = in.contiguous();
    withContiguous(out, true, [&](at::Tensor& c) {
      comm_->allGather(dataOf(src), dataOf(c), countOf(src), type);
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  TORCH_CHECK(static_cast<int>(outputLists.size()) == size_,
              "strata: allgather_coalesced: ", outputLists.size(), " output lists; the group has ",
              size_, " ranks");
  std::vector<DataType> types;
  for (const auto& in : inputs) types.push_back(typeOf(in, "allgather_coalesced"));
  std::vector<at::Tensor> flatOuts;
  for (const auto& list : outputLists) {
    TORCH_CHECK(list.size() == inputs.size(), "strata: allgather_coalesced: an output list has ",
                list.size(), " tensors, the input list ", inputs.size());
    for (size_t i = 0; i < list.size(); ++i) {
      checkSameType(list[i], inputs[i], "allgather_coalesced");
      TORCH_CHECK(list[i].numel() == inputs[i].numel(), "strata: allgather_coalesced: output ", i,
                  " has ", list[i].numel(), " elements, its input ", inputs[i].numel());
      flatOuts.push_back(list[i]);
    }
  }
  const size_t m = inputs.size();
  return enqueue(c10d::OpType::ALLGATHER_COALESCED, flatOuts,
                 [this, inputs, flatOuts, types, m]() mutable {
                   for (size_t i = 0; i < m; ++i) {
                     allGatherInto(inputs[i], types[i], [&](int r) -> at::Tensor& {
                       return flatOuts[static_cast<size_t>(r) * m + i];
                     });
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  at::Tensor in = single(inputs, "gather");
  const DataType type = typeOf(in, "gather");
  checkRoot(opts.rootRank, size_, "gather");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "strata: gather: the root needs one list of ", size_, " output tensors");
    outs = outputs[0];
    for (const auto& o : outs) {
      typeOf(o, "gather");
      checkSameType(o, in, "gather");
      TORCH_CHECK(o.numel() == in.numel(), "strata: gather: an output tensor has ", o.numel(),
                  " elements, the input ", in.numel());
    }
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "strata: gather: only the root (rank ", root, ") passes output tensors");
  }
  return enqueue(c10d::OpType::GATHER, outs, [this, in, outs, type, root]() mutable {
    at::Tensor src = in.contiguous();
    if (rank_ != root) {
      comm_->send(dataOf(src), countOf(src), type, root);
      return;
    }
    for (int r = 0; r < size_; ++r) {
      at::Tensor& o = outs[static_cast<size_t>(r)];
      if (r == root) {
        o.copy_(src.view(o.sizes()));
        continue;
      }
      withContiguous(o, true, [&](at::Tensor& c) { comm_->recv(dataOf(c), countOf(c), type, r); });
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  at::Tensor out = single(outputs, "scatter");
  const DataType type = typeOf(out, "scatter");
  checkRoot(opts.rootRank, size_, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> ins;
  if (rank_ == root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "strata: scatter: the root needs one list of ", size_, " input tensors");
    ins = inputs[0];
    for (const auto& i : ins) {
      typeOf(i, "scatter");
      checkSameType(i, out, "scatter");
      TORCH_CHECK(i.numel() == out.numel(), "strata: scatter: an input tensor has ", i.numel(),
                  " elements, the output ", out.numel());
    }
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "strata: scatter: only the root (rank ", root, ") passes input tensors");
  }
  return enqueue(c10d::OpType::SCATTER, {out}, [this, out, ins, type, root]() mutable {
    if (rank_ != root) {
      withContiguous(out, true,
                     [&](at::Tensor& c) { comm_->recv(dataOf(c), countOf(c), type, root); });
      return;
    }
    for (int r = 0; r < size_; ++r) {
      at::Tensor src = ins[static_cast<size_t>(r)].contiguous();
      if (r == root) {
        out.copy_(src.view(out.sizes()));
      } else {
        comm_->send(dataOf(src), countOf(src), type, r);
      }
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  at::Tensor out = single(outputs, "reduce_scatter");
  const DataType type = typeOf(out, "reduce_scatter");
  const ReduceOp op = reduceOpOf(opts.reduceOp, out, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
              "strata: reduce_scatter needs one list of ", size_, " input tensors");
  std::vector<at::Tensor> ins = inputs[0];
  for (const auto& i : ins) {
    typeOf(i, "reduce_scatter");
    checkSameType(i, out, "reduce_scatter");
    TORCH_CHECK(i.numel() == out.numel(), "strata: reduce_scatter: an input tensor has ", i.numel(),
                " elements, the output ", out.numel());
  }
  return enqueue(c10d::OpType::REDUCE_SCATTER, {out}, [this, out, ins, type, op]() mutable {
    std::vector<at::Tensor> flatIns;
    for (const auto& i : ins) flatIns.push_back(i.reshape({-1}));
    at::Tensor flat = at::cat(flatIns);
    withContiguous(out, true, [&](at::Tensor& c) {
      comm_->reduceScatter(dataOf(flat), dataOf(c), countOf(c), type, op);
    });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const DataType type = typeOf(output, "_reduce_scatter_base");
  typeOf(input, "_reduce_scatter_base");
  checkSameType(output, input, "_reduce_scatter_base");
  const ReduceOp op = reduceOpOf(opts.reduceOp, output, "_reduce_scatter_base");
  TORCH_CHECK(input.numel() == static_cast<int64_t>(size_) * output.numel(),
              "strata: _reduce_scatter_base: the input has ", input.numel(),
              " elements; it needs world size (", size_, ") times the output's ", output.numel());
  at::Tensor out = output, in = input;
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, {out}, [this, out, in, type, op]() mutable {
    at::Tensor src = in.contiguous();
    withContiguous(out, true, [&](at::Tensor& c) {
      comm_->reduceScatter(dataOf(src), dataOf(c), countOf(c), type, op);
    });
  });
}

void ProcessGroupStrata::exchange(const std::vector<const void*>& sendPtrs,
                                  const std::vector<size_t>& sendCounts,
                                  const std::vector<void*>& recvPtrs,
                                  const std::vector<size_t>& recvCounts, DataType type) {
  const size_t elem = sizeOf(type);
  for (int k = 0; k < size_; ++k) {
    const auto to = static_cast<size_t>((rank_ + k) % size_);
    const auto from = static_cast<size_t>((rank_ - k + size_) % size_);
    if (k == 0) {
      TORCH_CHECK(sendCounts[to] == recvCounts[to], "strata: alltoall: rank ", rank_, " sends ",
                  sendCounts[to], " elements to itself but expects ", recvCounts[to]);
      if (sendCounts[to] > 0) std::memmove(recvPtrs[to], sendPtrs[to], sendCounts[to] * elem);
      continue;
    }
    comm_->send(sendPtrs[to], sendCounts[to], type, static_cast<int>(to));
    comm_->recv(recvPtrs[from], recvCounts[from], type, static_cast<int>(from));
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::alltoall_base(at::Tensor& output,
                                                                 at::Tensor& input,
                                                                 std::vector<int64_t>& outputSplits,
                                                                 std::vector<int64_t>& inputSplits,
                                                                 const c10d::AllToAllOptions&) {
  const DataType type = typeOf(input, "alltoall_base");
  typeOf(output, "alltoall_base");
  checkSameType(output, input, "alltoall_base");
  auto splits = [&](const at::Tensor& t, const std::vector<int64_t>& given, const char* side) {
    std::vector<size_t> counts(static_cast<size_t>(size_));
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const int64_t rowElems = rows == 0 ? 0 : t.numel() / rows;
    if (given.empty()) {
      TORCH_CHECK(rows % size_ == 0, "strata: alltoall_base: the ", side, " has ", rows,
                  " rows in dimension 0, not a multiple of the world size ", size_,
                  "; pass split sizes");
      for (auto& c : counts) c = static_cast<size_t>(rows / size_ * rowElems);
      return counts;
    }
    TORCH_CHECK(static_cast<int>(given.size()) == size_, "strata: alltoall_base: ", side,
                " split sizes has ", given.size(), " entries; the group has ", size_, " ranks");
    int64_t sum = 0;
    for (size_t j = 0; j < given.size(); ++j) {
      TORCH_CHECK(given[j] >= 0, "strata: alltoall_base: negative ", side, " split size");
      sum += given[j];
      counts[j] = static_cast<size_t>(given[j] * rowElems);
    }
    TORCH_CHECK(sum == rows, "strata: alltoall_base: ", side, " split sizes add up to ", sum,
                " rows; the tensor has ", rows);
    return counts;
  };
  std::vector<size_t> sendCounts = splits(input, inputSplits, "input");
  std::vector<size_t> recvCounts = splits(output, outputSplits, "output");
  at::Tensor out = output, in = input;
  const bool equal = inputSplits.empty() && outputSplits.empty();
  TORCH_CHECK(!equal || in.numel() == out.numel(), "strata: alltoall_base: input and output have ",
              in.numel(), " and ", out.numel(), " elements; without split sizes they must match");
  return enqueue(c10d::OpType::ALLTOALL_BASE, {out},
                 [this, out, in, type, equal, sendCounts, recvCounts]() mutable {
                   at::Tensor src = in.contiguous();
                   withContiguous(out, true, [&](at::Tensor& c) {
                     if (equal) {
                       comm_->allToAll(dataOf(src), dataOf(c), countOf(src) / size_, type);
                       return;
                     }
                     const size_t elem = sizeOf(type);
                     std::vector<const void*> sp;
                     std::vector<void*> rp;
                     size_t so = 0, ro = 0;
                     auto* sb = static_cast<const char*>(dataOf(src));
                     auto* rb = static_cast<char*>(dataOf(c));
                     for (int j = 0; j < size_; ++j) {
                       sp.push_back(sb ? sb + so * elem : nullptr);
                       rp.push_back(rb ? rb + ro * elem : nullptr);
                       so += sendCounts[static_cast<size_t>(j)];
                       ro += recvCounts[static_cast<size_t>(j)];
                     }
                     exchange(sp, sendCounts, rp, recvCounts, type);
                   });
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions&) {
  TORCH_CHECK(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_,
              "strata: alltoall needs ", size_, " input and ", size_, " output tensors (got ",
              inputs.size(), " and ", outputs.size(), ")");
  const DataType type = typeOf(inputs[0], "alltoall");
  for (int j = 0; j < size_; ++j) {
    typeOf(inputs[static_cast<size_t>(j)], "alltoall");
    typeOf(outputs[static_cast<size_t>(j)], "alltoall");
    checkSameType(inputs[static_cast<size_t>(j)], inputs[0], "alltoall");
    checkSameType(outputs[static_cast<size_t>(j)], inputs[0], "alltoall");
  }
  std::vector<at::Tensor> outs = outputs, ins = inputs;
  return enqueue(c10d::OpType::ALLTOALL, outs, [this, outs, ins, type]() mutable {
    std::vector<at::Tensor> srcs, dsts;
    std::vector<const void*> sp;
    std::vector<void*> rp;
    std::vector<size_t> sc, rc;
    for (int j = 0; j < size_; ++j) {
      srcs.push_back(ins[static_cast<size_t>(j)].contiguous());
      at::Tensor& o = outs[static_cast<size_t>(j)];
      dsts.push_back(o.is_contiguous() ? o : at::empty_like(o, at::MemoryFormat::Contiguous));
      sp.push_back(dataOf(srcs.back()));
      rp.push_back(dataOf(dsts.back()));
      sc.push_back(countOf(srcs.back()));
      rc.push_back(countOf(dsts.back()));
    }
    exchange(sp, sc, rp, rc, type);
    for (int j = 0; j < size_; ++j) {
      at::Tensor& o = outs[static_cast<size_t>(j)];
      if (!o.is_contiguous()) o.copy_(dsts[static_cast<size_t>(j)]);
    }
  });
}

// --- point to point -------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::send(std::vector<at::Tensor>& tensors, int dst,
                                                        int tag) {
  at::Tensor t = single(tensors, "send");
  const DataType type = typeOf(t, "send");
  TORCH_CHECK(dst >= 0 && dst < size_ && dst != rank_, "strata: send: destination ", dst,
              " is not another rank of 0..", size_ - 1);
  // The data is taken now: the caller may reuse the tensor once the work completes, and a
  // host send completes when strata holds the data.
  return enqueue(
      c10d::OpType::SEND, {t},
      [this, t, type, dst, tag]() {
        at::Tensor src = t.contiguous();
        P2pHeader h;
        h.tag = tag;
        h.count = src.numel();
        h.type = static_cast<int64_t>(type);
        comm_->send(&h, sizeof h, DataType::Uint8, dst);
        comm_->send(dataOf(src), countOf(src), type, dst);
      },
      Kind::Send);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::recv(std::vector<at::Tensor>& tensors, int src,
                                                        int tag) {
  at::Tensor t = single(tensors, "recv");
  const DataType type = typeOf(t, "recv");
  TORCH_CHECK(src >= 0 && src < size_ && src != rank_, "strata: recv: source ", src,
              " is not another rank of 0..", size_ - 1);
  return enqueue(
      c10d::OpType::RECV, {t},
      [this, t, type, src, tag]() mutable {
        P2pHeader h;
        comm_->recv(&h, sizeof h, DataType::Uint8, src);
        if (h.magic != P2pHeader{}.magic || h.tag != tag || h.count != t.numel() ||
            h.type != static_cast<int64_t>(type)) {
          std::ostringstream s;
          s << "recv from rank " << src << " with tag " << tag << " expects " << t.numel()
            << " elements of " << toString(type) << ", but the next message from rank " << src;
          if (h.magic != P2pHeader{}.magic) {
            s << " is not a torch send (the ranks issued different calls)";
          } else {
            s << " has tag " << h.tag << " and " << h.count << " elements of "
              << toString(static_cast<DataType>(h.type));
          }
          s << ". strata matches the sends and receives between two ranks in the order they "
               "are issued, tags included; the process group is unusable now";
          throw Error(ErrorCode::ProtocolError, s.str(), src);
        }
        withContiguous(t, true,
                       [&](at::Tensor& c) { comm_->recv(dataOf(c), countOf(c), type, src); });
      },
      Kind::Recv);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::recvAnysource(std::vector<at::Tensor>&, int) {
  TORCH_CHECK(false,
              "strata: recv from any source (dist.recv or dist.irecv without src) is not "
              "supported: strata matches messages per peer; pass src=");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::barrier(const c10d::BarrierOptions&) {
  return enqueue(c10d::OpType::BARRIER, {}, [this]() {
    int32_t token = 1;
    comm_->allReduce(&token, &token, 1, DataType::Int32, ReduceOp::Sum);
    if (token != size_) {
      throw Error(ErrorCode::ProtocolError,
                  "barrier: " + std::to_string(token) + " of " + std::to_string(size_) +
                      " ranks counted (the ranks issued different calls)");
    }
  });
}

// Through the store, not the communicator, so that it works (and names the missing ranks) even
// when the communicator is stuck: every rank sets its key, rank 0 waits for each key with the
// timeout, then sets the release key the others wait for.
void ProcessGroupStrata::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  uint64_t id = 0;
  {
    std::lock_guard lock(mu_);
    id = monitored_++;
  }
  const auto timeout = opts.timeout.count() > 0 ? opts.timeout : timeout_;
  const std::string base = "strata/monitored/" + std::to_string(id) + "/";
  if (rank_ != 0) {
    store_->set(base + std::to_string(rank_), bytesOf("1"));
    // Rank 0 decides within `timeout` and then publishes: wait for that a while longer.
    const auto release = timeout + std::max(timeout, std::chrono::milliseconds(5000));
    try {
      store_->wait({base + "done"}, release);
    } catch (const std::exception& e) {
      throw std::runtime_error("strata: monitored_barrier: rank " + std::to_string(rank_) +
                               " was not released by rank 0 within " + seconds(release) +
                               " s: " + e.what());
    }
    if (stringOf(store_->get(base + "done")) != "ok") {
      throw std::runtime_error("strata: monitored_barrier: rank 0 reports that ranks " +
                               stringOf(store_->get(base + "done")) + " did not arrive");
    }
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> missing;
  for (int r = 1; r < size_; ++r) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    bool arrived = false;
    if (left.count() > 0 || missing.empty()) {
      try {
        store_->wait({base + std::to_string(r)}, std::max(left, std::chrono::milliseconds(1)));
        arrived = true;
      } catch (const std::exception&) {
      }
    } else {
      arrived = store_->check({base + std::to_string(r)});
    }
    if (!arrived) {
      missing.push_back(r);
      if (!waitAllRanks) break;
    }
  }
  if (missing.empty()) {
    store_->set(base + "done", bytesOf("ok"));
    return;
  }
  std::string list;
  for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
  store_->set(base + "done", bytesOf(list));
  throw std::runtime_error("strata: monitored_barrier: rank" +
                           std::string(missing.size() > 1 ? "s " : " ") + list +
                           " did not arrive within " + seconds(timeout) + " s");
}

void ProcessGroupStrata::setSequenceNumberForGroup() {
  std::lock_guard lock(mu_);
  sequence_ = 0;
}

uint64_t ProcessGroupStrata::getSequenceNumberForGroup() {
  std::lock_guard lock(mu_);
  return sequence_;
}

}  // namespace strata::torchbind
