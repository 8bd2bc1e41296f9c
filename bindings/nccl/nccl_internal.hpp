#pragma once

// The NCCL API over strata (bindings/nccl): what nccl_api.cpp (communicators, collectives,
// errors) and nccl_group.cpp (groups) share. docs/nccl-api.md says what each function does.

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <strata/communicator.hpp>
#include <strata/error.hpp>
#include <strata/types.hpp>

/// An NCCL communicator: a strata::Communicator and what the NCCL API keeps beside it.
struct ncclComm {
  static constexpr uint64_t kMagic = 0x5354524154414e43ull;  // "STRATANC"
  uint64_t magic = kMagic;
  std::unique_ptr<strata::Communicator> comm;
  int rank = -1;
  int size = 0;
  int device = 0;
  std::string name;  ///< ncclConfig_t::commName
  /// ncclInProgress while a non-blocking or grouped init runs; then ncclSuccess or its error.
  std::atomic<int> initState{ncclInProgress};
  std::thread initThread;
  /// Set when a call failed in a way that breaks the communicator (a peer lost, a timeout):
  /// every later call fails at once with it.
  std::atomic<int> broken{ncclSuccess};
  std::mutex mu;
  std::string lastError;  ///< under mu
  /// Pre-multiply-sum operators (ncclRedOpCreatePreMulSum), by op - ncclNumOps.
  struct PreMulSum {
    bool live = false;
    strata::DataType type = strata::DataType::Float32;
    double scalar = 0;             ///< ncclScalarHostImmediate
    const void* device = nullptr;  ///< ncclScalarDevice: read when the call runs
  };
  std::vector<PreMulSum> preMulSums;  ///< under mu
  std::vector<std::unique_ptr<char[]>> registrations;
  /// STRATA_NCCL_FALLBACK: the real NCCL's communicator on the same ranks, for what strata
  /// cannot serve (nccl_api.cpp, "Fallback").
  ncclComm_t fallbackComm = nullptr;
  std::vector<std::string> fallbackLogged;  ///< calls already logged as sent there (under mu)
  std::vector<char> scratch;                ///< host temporaries (reduce, pre-mul-sum)
  /// ncclCommShrink made a communicator from this one: the survivors' new communicators talk over
  /// its bootstrap, which ncclCommAbort must then leave alone.
  bool shrunk = false;
};

namespace strata::nccl {

/// ncclResult_t of a strata error (docs/nccl-api.md, "Errors").
ncclResult_t resultOf(const Error& e) noexcept;
/// Records msg as comm's last error (and this thread's, for ncclGetLastError(NULL)).
void setLastError(ncclComm* comm, const std::string& msg) noexcept;
/// ncclInvalidArgument/Usage with a message, recorded.
ncclResult_t fail(ncclComm* comm, ncclResult_t code, const std::string& msg) noexcept;
/// Whether comm is a live communicator handle.
bool valid(const ncclComm* comm) noexcept;

/// One call of a group: a collective, or one side of a send/recv.
struct GroupOp {
  ncclComm* comm = nullptr;
  enum Kind { Collective, Send, Recv } kind = Collective;
  std::function<void()> run;  ///< the whole call (collectives, and p2p outside a batch)
  // send/recv: what batching needs
  const void* sendBuf = nullptr;
  void* recvBuf = nullptr;
  size_t count = 0;
  DataType type = DataType::Uint8;
  int peer = -1;
  cudaStream_t stream = nullptr;
};

/// The calling thread's group depth (ncclGroupStart nesting).
int groupDepth() noexcept;
/// Queues an op of the current group.
void groupAdd(GroupOp op);
/// Queues the init of comm, run when the outermost group ends (inits of one group run at
/// once, in threads: a process that initialises several ranks in a group, as nccl-tests does).
void groupAddInit(std::function<void()> init);
/// The stream a strata call takes for buf: the caller's for device memory, none for host memory
/// (after waiting for the stream's earlier work when CUDA is loaded).
cudaStream_t hostOrdered(const void* buf, cudaStream_t stream);
/// Runs a batch of send/recv ops of one communicator as one operation.
void runP2pBatch(ncclComm* comm, std::vector<GroupOp>& ops);

/// The ncclResult_t of the exception being handled (recorded as comm's last error); marks the
/// communicator broken on errors that leave it unusable. Call only inside a catch block.
ncclResult_t caught(ncclComm* comm) noexcept;

/// Runs f on comm, turning a strata error into an ncclResult_t (caught()). A template, so that
/// a call outside a group costs no std::function.
template <typename F>
ncclResult_t guarded(ncclComm* comm, F&& f) noexcept {
  try {
    f();
    return ncclSuccess;
  } catch (...) {
    return caught(comm);
  }
}

}  // namespace strata::nccl
