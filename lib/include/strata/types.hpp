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

/// Where a collective runs: a cudaStream_t for device memory; ignored for host memory, where a
/// collective completes before it returns.
struct Stream {
  void* handle = nullptr;
};

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
