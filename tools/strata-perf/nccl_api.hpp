#pragma once

// strata-perf --api nccl: the collective modes' calls through an NCCL library loaded with
// dlopen (libstrata-nccl.so.2 by default, or any libnccl.so.2 given with --nccl-lib), so that
// the NCCL door is measured with the same rows as strata::Communicator. The NCCL ABI values it
// needs (result codes, datatype and op numbers) are NCCL's, stable since 2.x; strata-perf
// includes no nccl.h.

#include <cstddef>
#include <memory>
#include <string>

#include <strata/bootstrap.hpp>
#include <strata/types.hpp>

namespace strata::perf {

class NcclApi {
 public:
  /// Loads `library` (dlopen's search rules) and makes this rank's communicator: rank 0's id
  /// goes to the others over `boot`. Throws Error(NotSupported) when the library or a
  /// function is missing, Error(BackendError) with the library's last error when a call fails.
  NcclApi(const std::string& library, Bootstrap& boot);
  ~NcclApi();
  NcclApi(const NcclApi&) = delete;
  NcclApi& operator=(const NcclApi&) = delete;

  /// What dlopen found (the path it resolved, and the library's version code).
  std::string describe() const;

  void allReduce(const void* s, void* r, size_t count, DataType t, ReduceOp op, void* stream);
  void allGather(const void* s, void* r, size_t count, DataType t, void* stream);
  void reduceScatter(const void* s, void* r, size_t count, DataType t, ReduceOp op, void* stream);
  void broadcast(const void* s, void* r, size_t count, DataType t, int root, void* stream);
  void allToAll(const void* s, void* r, size_t count, DataType t, void* stream);
  /// allToAll as PyTorch and DeepSpeed issue it: one group of a send and a receive per rank.
  void allToAllGrouped(const void* s, void* r, size_t count, DataType t, int nranks, void* stream);
  /// One group: a send to `to` and a receive from `from` (nccl-tests' sendrecv).
  void sendRecv(const void* s, int to, void* r, int from, size_t count, DataType t, void* stream);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::perf
