// The DataType and ReduceOp helpers of <strata/types.hpp>: sizes, names, parsing, and
// whether a value (from a cast or across an ABI) is one of the enumerators.

#include <strata/types.hpp>

#include <utility>

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

bool isKnown(DataType type) noexcept {
  // No default: a DataType added without a case here is a -Wswitch warning.
  switch (type) {
    case DataType::Int8:
    case DataType::Uint8:
    case DataType::Int32:
    case DataType::Uint32:
    case DataType::Int64:
    case DataType::Uint64:
    case DataType::Float16:
    case DataType::BFloat16:
    case DataType::Float32:
    case DataType::Float64:
      return true;
  }
  return false;
}

bool isKnown(ReduceOp op) noexcept {
  // No default: a ReduceOp added without a case here is a -Wswitch warning.
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Prod:
    case ReduceOp::Min:
    case ReduceOp::Max:
    case ReduceOp::Avg:
      return true;
  }
  return false;
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

}  // namespace strata
