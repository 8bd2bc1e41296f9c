#pragma once

// The element types, reductions and streams of the collectives, with their helpers: what the
// Communicator, the collectives SDK and the algorithms share (no class of any layer).

#include <cstddef>
#include <optional>
#include <string_view>

#include <strata/export.hpp>

namespace strata {

/// Element types of the collectives. Float16 is IEEE binary16, BFloat16 is bfloat16; both are
/// reduced with fp32 accumulation.
enum class DataType {
  Int8,
  Uint8,
  Int32,
  Uint32,
  Int64,
  Uint64,
  Float16,
  BFloat16,
  Float32,
  Float64
};

/// Reductions. Avg is NCCL's: the sum divided by the number of ranks (integer division,
/// truncating, for integer types).
enum class ReduceOp { Sum, Prod, Min, Max, Avg };

/// Where a collective runs: a cudaStream_t for device memory. On host memory a collective
/// completes before it returns; given a stream, it first waits for the work queued on it
/// (hostOrdered below).
struct Stream {
  void* handle = nullptr;
};

/// One send or receive of Communicator::sendRecv (a batch issued together, as an NCCL group of
/// ncclSend/ncclRecv or torch's batch_isend_irecv).
struct PointToPoint {
  enum class Kind : unsigned char { Send, Recv };
  Kind kind = Kind::Send;
  const void* send = nullptr;  ///< Send: count elements to the peer
  void* recv = nullptr;        ///< Recv: where count elements from the peer land
  size_t count = 0;
  DataType type = DataType::Float32;
  int peer = -1;
  static PointToPoint sendTo(const void* buf, size_t count, DataType type, int peer) {
    return {Kind::Send, buf, nullptr, count, type, peer};
  }
  static PointToPoint recvFrom(void* buf, size_t count, DataType type, int peer) {
    return {Kind::Recv, nullptr, buf, count, type, peer};
  }
};

/// What a call on `buffer` does with `stream` before host work touches the buffer: for device
/// memory, nothing (returns the stream, which orders the device work); for host memory (plain,
/// pinned or managed), waits for the stream through the CUDA driver where the process has
/// loaded it (cuStreamSynchronize; nothing without the driver, where no CUDA work can be
/// pending) and returns no stream. Throws BackendError when the stream reports an earlier
/// failure. Every Communicator call does this; bindings that touch host buffers themselves
/// (a pre-multiplication, a copy to self) call it first.
STRATA_API Stream hostOrdered(const void* buffer, Stream stream);

/// Whether p is CUDA device memory (not pinned or managed host memory the CPU may touch), asked
/// of the CUDA driver where the process has loaded it; false without it.
STRATA_API bool isDeviceMemory(const void* p) noexcept;

/// dst[i] = src[i] * factor for count elements of host memory, in the type's arithmetic as
/// NCCL's pre-multiplication does it: the factor converted to the type first, then one
/// product per element (half and bfloat16 through fp32, rounded to nearest even). dst may be
/// src. Throws InvalidArgument for an unknown type.
STRATA_API void scaleElements(void* dst, const void* src, size_t count, DataType type,
                              double factor);

/// One element of type at p (host memory) as a double. Throws InvalidArgument for an unknown
/// type.
STRATA_API double elementAsDouble(const void* p, DataType type);

/// Bytes per element (0 for a value that is not a DataType).
STRATA_API size_t sizeOf(DataType type) noexcept;
/// Whether the value is one of the enumerators (input from outside may be anything).
STRATA_API bool isKnown(DataType type) noexcept;
STRATA_API bool isKnown(ReduceOp op) noexcept;
/// "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "bfloat16", "float",
/// "double" (nccl-tests' names).
STRATA_API std::string_view toString(DataType type) noexcept;
/// "sum", "prod", "min", "max", "avg".
STRATA_API std::string_view toString(ReduceOp op) noexcept;
/// The inverse of toString; also accepts "float16", "fp16", "bf16", "float32", "fp32",
/// "float64", "fp64", "char" (int8). nullopt for anything else.
STRATA_API std::optional<DataType> parseDataType(std::string_view name) noexcept;
STRATA_API std::optional<ReduceOp> parseReduceOp(std::string_view name) noexcept;

}  // namespace strata
