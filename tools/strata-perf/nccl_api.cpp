#include "nccl_api.hpp"

#include <dlfcn.h>
#include <link.h>

#include <cstring>

#include <fmt/format.h>
#include <strata/error.hpp>

namespace strata::perf {

namespace {

using Comm = void*;
using Result = int;
constexpr int kIdBytes = 128;
struct Id {
  char bytes[kIdBytes];
};

// NCCL's datatype numbers (nccl.h): int8 0, uint8 1, int32 2, uint32 3, int64 4, uint64 5,
// float16 6, float32 7, float64 8, bfloat16 9.
int ncclType(DataType t) {
  switch (t) {
    case DataType::Int8:
      return 0;
    case DataType::Uint8:
      return 1;
    case DataType::Int32:
      return 2;
    case DataType::Uint32:
      return 3;
    case DataType::Int64:
      return 4;
    case DataType::Uint64:
      return 5;
    case DataType::Float16:
      return 6;
    case DataType::Float32:
      return 7;
    case DataType::Float64:
      return 8;
    case DataType::BFloat16:
      return 9;
  }
  return -1;
}

// sum 0, prod 1, max 2, min 3, avg 4.
int ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return 0;
    case ReduceOp::Prod:
      return 1;
    case ReduceOp::Max:
      return 2;
    case ReduceOp::Min:
      return 3;
    case ReduceOp::Avg:
      return 4;
  }
  return -1;
}

}  // namespace

struct NcclApi::Impl {
  void* lib = nullptr;
  Comm comm = nullptr;
  std::string path;
  int version = 0;
  Result (*getVersion)(int*) = nullptr;
  Result (*getUniqueId)(Id*) = nullptr;
  Result (*commInitRank)(Comm*, int, Id, int) = nullptr;
  Result (*commDestroy)(Comm) = nullptr;
  const char* (*getErrorString)(Result) = nullptr;
  const char* (*getLastError)(Comm) = nullptr;
  Result (*allReduce)(const void*, void*, size_t, int, int, Comm, void*) = nullptr;
  Result (*allGather)(const void*, void*, size_t, int, Comm, void*) = nullptr;
  Result (*reduceScatter)(const void*, void*, size_t, int, int, Comm, void*) = nullptr;
  Result (*broadcast)(const void*, void*, size_t, int, int, Comm, void*) = nullptr;
  Result (*allToAll)(const void*, void*, size_t, int, Comm, void*) = nullptr;
  Result (*send)(const void*, size_t, int, int, Comm, void*) = nullptr;
  Result (*recv)(void*, size_t, int, int, Comm, void*) = nullptr;
  Result (*groupStart)() = nullptr;
  Result (*groupEnd)() = nullptr;

  template <typename F>
  void load(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(lib, name));
    if (f == nullptr) {
      throw Error(ErrorCode::NotSupported,
                  fmt::format("--api nccl: {} has no {} (not an NCCL 2.x library)", path, name));
    }
  }
  void check(Result r, const char* what) const {
    if (r == 0) return;
    throw Error(ErrorCode::BackendError, fmt::format("{} returned {} ({}): {}", what, r,
                                                     getErrorString(r), getLastError(comm)));
  }
};

NcclApi::NcclApi(const std::string& library, Bootstrap& boot) : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (I.lib == nullptr) {
    const char* err = dlerror();
    throw Error(ErrorCode::NotSupported,
                fmt::format("--api nccl: cannot load {}: {} (build/bindings/nccl holds "
                            "libstrata-nccl.so.2: put it on LD_LIBRARY_PATH or give --nccl-lib)",
                            library, err ? err : "unknown error"));
  }
  link_map* map = nullptr;
  I.path = dlinfo(I.lib, RTLD_DI_LINKMAP, &map) == 0 && map ? map->l_name : library;
  I.load(I.getVersion, "ncclGetVersion");
  I.load(I.getUniqueId, "ncclGetUniqueId");
  I.load(I.commInitRank, "ncclCommInitRank");
  I.load(I.commDestroy, "ncclCommDestroy");
  I.load(I.getErrorString, "ncclGetErrorString");
  I.load(I.getLastError, "ncclGetLastError");
  I.load(I.allReduce, "ncclAllReduce");
  I.load(I.allGather, "ncclAllGather");
  I.load(I.reduceScatter, "ncclReduceScatter");
  I.load(I.broadcast, "ncclBroadcast");
  I.load(I.allToAll, "ncclAlltoAll");
  I.load(I.send, "ncclSend");
  I.load(I.recv, "ncclRecv");
  I.load(I.groupStart, "ncclGroupStart");
  I.load(I.groupEnd, "ncclGroupEnd");
  I.check(I.getVersion(&I.version), "ncclGetVersion");
  Id id{};
  if (boot.rank() == 0) I.check(I.getUniqueId(&id), "ncclGetUniqueId");
  boot.broadcast(&id, sizeof id, 0);
  I.check(I.commInitRank(&I.comm, boot.size(), id, boot.rank()), "ncclCommInitRank");
}

NcclApi::~NcclApi() {
  if (impl_->comm) impl_->commDestroy(impl_->comm);
  // The library stays loaded: its threads and atexit handlers may outlive this object.
}

std::string NcclApi::describe() const {
  return fmt::format("{} (ncclGetVersion {})", impl_->path, impl_->version);
}

void NcclApi::allReduce(const void* s, void* r, size_t count, DataType t, ReduceOp op,
                        void* stream) {
  impl_->check(impl_->allReduce(s, r, count, ncclType(t), ncclOp(op), impl_->comm, stream),
               "ncclAllReduce");
}

void NcclApi::allGather(const void* s, void* r, size_t count, DataType t, void* stream) {
  impl_->check(impl_->allGather(s, r, count, ncclType(t), impl_->comm, stream), "ncclAllGather");
}

void NcclApi::reduceScatter(const void* s, void* r, size_t count, DataType t, ReduceOp op,
                            void* stream) {
  impl_->check(impl_->reduceScatter(s, r, count, ncclType(t), ncclOp(op), impl_->comm, stream),
               "ncclReduceScatter");
}

void NcclApi::broadcast(const void* s, void* r, size_t count, DataType t, int root, void* stream) {
  impl_->check(impl_->broadcast(s, r, count, ncclType(t), root, impl_->comm, stream),
               "ncclBroadcast");
}

void NcclApi::allToAll(const void* s, void* r, size_t count, DataType t, void* stream) {
  impl_->check(impl_->allToAll(s, r, count, ncclType(t), impl_->comm, stream), "ncclAlltoAll");
}

void NcclApi::allToAllGrouped(const void* s, void* r, size_t count, DataType t, int nranks,
                              void* stream) {
  const size_t bytes = count * sizeOf(t);
  impl_->check(impl_->groupStart(), "ncclGroupStart");
  for (int p = 0; p < nranks; ++p) {
    impl_->check(impl_->send(static_cast<const char*>(s) + p * bytes, count, ncclType(t), p,
                             impl_->comm, stream),
                 "ncclSend");
    impl_->check(
        impl_->recv(static_cast<char*>(r) + p * bytes, count, ncclType(t), p, impl_->comm, stream),
        "ncclRecv");
  }
  impl_->check(impl_->groupEnd(), "ncclGroupEnd");
}

void NcclApi::sendRecv(const void* s, int to, void* r, int from, size_t count, DataType t,
                       void* stream) {
  impl_->check(impl_->groupStart(), "ncclGroupStart");
  impl_->check(impl_->send(s, count, ncclType(t), to, impl_->comm, stream), "ncclSend");
  impl_->check(impl_->recv(r, count, ncclType(t), from, impl_->comm, stream), "ncclRecv");
  impl_->check(impl_->groupEnd(), "ncclGroupEnd");
}

}  // namespace strata::perf
