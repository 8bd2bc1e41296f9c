// The Communicator: argument checks, then the host collectives of collectives/host.

#include <strata/communicator.hpp>

#include <cstring>
#include <limits>

#include <fmt/format.h>

#include <strata/error.hpp>
#include <strata/transport.hpp>

#include "collectives/host/algorithms.hpp"
#include "collectives/host/engine.hpp"

namespace strata {

size_t sizeOf(DataType type) noexcept {
  switch (type) {
    case DataType::Int8:
    case DataType::Uint8:
      return 1;
    case DataType::Float16:
    case DataType::BFloat16:
      return 2;
    case DataType::Int32:
    case DataType::Uint32:
    case DataType::Float32:
      return 4;
    case DataType::Int64:
    case DataType::Uint64:
    case DataType::Float64:
      return 8;
  }
  return 0;
}

std::string_view toString(DataType type) noexcept {
  switch (type) {
    case DataType::Int8:
      return "int8";
    case DataType::Uint8:
      return "uint8";
    case DataType::Int32:
      return "int32";
    case DataType::Uint32:
      return "uint32";
    case DataType::Int64:
      return "int64";
    case DataType::Uint64:
      return "uint64";
    case DataType::Float16:
      return "half";
    case DataType::BFloat16:
      return "bfloat16";
    case DataType::Float32:
      return "float";
    case DataType::Float64:
      return "double";
  }
  return "unknown";
}

std::string_view toString(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Prod:
      return "prod";
    case ReduceOp::Min:
      return "min";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Avg:
      return "avg";
  }
  return "unknown";
}

std::optional<DataType> parseDataType(std::string_view name) noexcept {
  static constexpr std::pair<std::string_view, DataType> kNames[] = {
      {"int8", DataType::Int8},       {"char", DataType::Int8},
      {"uint8", DataType::Uint8},     {"int32", DataType::Int32},
      {"int", DataType::Int32},       {"uint32", DataType::Uint32},
      {"int64", DataType::Int64},     {"uint64", DataType::Uint64},
      {"half", DataType::Float16},    {"float16", DataType::Float16},
      {"fp16", DataType::Float16},    {"bfloat16", DataType::BFloat16},
      {"bf16", DataType::BFloat16},   {"float", DataType::Float32},
      {"float32", DataType::Float32}, {"fp32", DataType::Float32},
      {"double", DataType::Float64},  {"float64", DataType::Float64},
      {"fp64", DataType::Float64},
  };
  for (const auto& [n, t] : kNames) {
    if (n == name) return t;
  }
  return std::nullopt;
}

std::optional<ReduceOp> parseReduceOp(std::string_view name) noexcept {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg}) {
    if (toString(op) == name) return op;
  }
  return std::nullopt;
}

struct Communicator::Impl {
  std::shared_ptr<Bootstrap> bootstrap;
  std::shared_ptr<Context> context;
  std::unique_ptr<collectives::Engine> engine;
  int rank = 0;
  int size = 1;
  /// Set by the first error while data moved: the pair counters may be out of step, so every
  /// later call fails at once instead of mixing up data.
  std::optional<Error> broken;

  template <typename F>
  void guarded(const char* what, F&& fn) {
    if (broken) {
      throw Error(broken->code(),
                  fmt::format("{}: the communicator failed earlier and cannot be used: {}", what,
                              broken->what()),
                  broken->peer());
    }
    std::lock_guard<std::mutex> lock(engine->mutex());
    try {
      engine->checkDelivery();
      fn();
    } catch (const Error& e) {
      broken = e;
      engine->abandon();
      throw;
    } catch (const std::exception& e) {
      broken = Error(ErrorCode::Internal, e.what());
      engine->abandon();
      throw;
    }
  }
};

namespace {

[[noreturn]] void invalid(const char* what, const std::string& why) {
  throw Error(ErrorCode::InvalidArgument, fmt::format("{}: {}", what, why));
}

void checkType(const char* what, DataType type) {
  if (sizeOf(type) == 0) {
    invalid(what, fmt::format("unknown data type {}", static_cast<int>(type)));
  }
}

void checkOp(const char* what, ReduceOp op) {
  if (static_cast<int>(op) < 0 || static_cast<int>(op) > static_cast<int>(ReduceOp::Avg)) {
    invalid(what, fmt::format("unknown reduce op {}", static_cast<int>(op)));
  }
}

void checkStream(const char* what, Stream stream) {
  if (stream.handle) {
    throw Error(ErrorCode::NotSupported,
                fmt::format("{}: a CUDA stream was given, but this build runs collectives on host "
                            "memory only (device-memory collectives come with the CUDA kernels); "
                            "pass host buffers and no stream",
                            what));
  }
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
                       int rank, int size, Stream stream) {
  checkType(what, type);
  checkStream(what, stream);
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

}  // namespace

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
  impl->context = Context::create(std::move(bootstrap), config);
  impl->engine = std::make_unique<collectives::Engine>(impl->context, config);
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

void Communicator::allReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                             Stream stream) {
  const char* what = "allReduce";
  checkType(what, type);
  checkOp(what, op);
  checkStream(what, stream);
  size_t bytes = bytesOf(what, count, type);
  checkBuffer(what, "send buffer", send, bytes);
  checkBuffer(what, "recv buffer", recv, bytes);
  if (send != recv && overlap(send, bytes, recv, bytes)) {
    invalid(what, "send and recv buffers overlap but are not the same (in place: send == recv)");
  }
  impl_->guarded(what,
                 [&] { collectives::allReduce(*impl_->engine, send, recv, count, type, op); });
}

void Communicator::allGather(const void* send, void* recv, size_t sendCount, DataType type,
                             Stream stream) {
  const char* what = "allGather";
  checkType(what, type);
  checkStream(what, stream);
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
  impl_->guarded(what,
                 [&] { collectives::allGather(*impl_->engine, send, recv, sendCount, type); });
}

void Communicator::reduceScatter(const void* send, void* recv, size_t recvCount, DataType type,
                                 ReduceOp op, Stream stream) {
  const char* what = "reduceScatter";
  checkType(what, type);
  checkOp(what, op);
  checkStream(what, stream);
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
  impl_->guarded(
      what, [&] { collectives::reduceScatter(*impl_->engine, send, recv, recvCount, type, op); });
}

void Communicator::broadcast(const void* send, void* recv, size_t count, DataType type, int root,
                             Stream stream) {
  const char* what = "broadcast";
  checkType(what, type);
  checkStream(what, stream);
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
  impl_->guarded(what,
                 [&] { collectives::broadcast(*impl_->engine, send, recv, count, type, root); });
}

void Communicator::allToAll(const void* send, void* recv, size_t countPerRank, DataType type,
                            Stream stream) {
  const char* what = "allToAll";
  checkType(what, type);
  checkStream(what, stream);
  size_t total = bytesOf(what, countPerRank, type, static_cast<size_t>(impl_->size));
  checkBuffer(what, "send buffer", send, total);
  checkBuffer(what, "recv buffer", recv, total);
  if (overlap(send, total, recv, total)) {
    invalid(what, "send and recv buffers overlap (allToAll has no in-place form)");
  }
  impl_->guarded(what,
                 [&] { collectives::allToAll(*impl_->engine, send, recv, countPerRank, type); });
}

void Communicator::send(const void* buf, size_t count, DataType type, int peer, Stream stream) {
  const char* what = "send";
  checkPointToPoint(what, buf, count, type, peer, impl_->rank, impl_->size, stream);
  impl_->guarded(what, [&] { collectives::send(*impl_->engine, buf, count, type, peer); });
}

void Communicator::recv(void* buf, size_t count, DataType type, int peer, Stream stream) {
  const char* what = "recv";
  checkPointToPoint(what, buf, count, type, peer, impl_->rank, impl_->size, stream);
  impl_->guarded(what, [&] { collectives::recv(*impl_->engine, buf, count, type, peer); });
}

}  // namespace strata
