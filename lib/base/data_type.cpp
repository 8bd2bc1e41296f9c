// The DataType and ReduceOp helpers of <strata/types.hpp>: sizes, names, parsing, and
// whether a value (from a cast or across an ABI) is one of the enumerators.

#include <strata/types.hpp>

#include <cstring>
#include <utility>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/float16.hpp"

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

namespace {

template <typename T>
void scaleAs(void* dst, const void* src, size_t n, double factor) {
  auto* d = static_cast<T*>(dst);
  auto* x = static_cast<const T*>(src);
  const T k = static_cast<T>(factor);  // as NCCL: the factor in the datatype, then a product
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(x[i] * k);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void scale16(void* dst, const void* src, size_t n, double factor) {
  const float k = ToFloat(FromFloat(static_cast<float>(factor)));
  auto* d = static_cast<uint16_t*>(dst);
  auto* x = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = FromFloat(ToFloat(x[i]) * k);
}

template <typename T>
double valueAs(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return static_cast<double>(v);
}

[[noreturn]] void unknownType(const char* what, DataType type) {
  throw Error(ErrorCode::InvalidArgument,
              fmt::format("{}: unknown data type {}", what, static_cast<int>(type)));
}

}  // namespace

void scaleElements(void* dst, const void* src, size_t n, DataType type, double factor) {
  using namespace collectives;
  switch (type) {
    case DataType::Int8:
      return scaleAs<int8_t>(dst, src, n, factor);
    case DataType::Uint8:
      return scaleAs<uint8_t>(dst, src, n, factor);
    case DataType::Int32:
      return scaleAs<int32_t>(dst, src, n, factor);
    case DataType::Uint32:
      return scaleAs<uint32_t>(dst, src, n, factor);
    case DataType::Int64:
      return scaleAs<int64_t>(dst, src, n, factor);
    case DataType::Uint64:
      return scaleAs<uint64_t>(dst, src, n, factor);
    case DataType::Float32:
      return scaleAs<float>(dst, src, n, factor);
    case DataType::Float64:
      return scaleAs<double>(dst, src, n, factor);
    case DataType::Float16:
      return scale16<halfToFloat, floatToHalf>(dst, src, n, factor);
    case DataType::BFloat16:
      return scale16<bf16ToFloat, floatToBf16>(dst, src, n, factor);
  }
  unknownType("scaleElements", type);
}

double elementAsDouble(const void* p, DataType type) {
  using namespace collectives;
  switch (type) {
    case DataType::Int8:
      return valueAs<int8_t>(p);
    case DataType::Uint8:
      return valueAs<uint8_t>(p);
    case DataType::Int32:
      return valueAs<int32_t>(p);
    case DataType::Uint32:
      return valueAs<uint32_t>(p);
    case DataType::Int64:
      return valueAs<int64_t>(p);
    case DataType::Uint64:
      return valueAs<uint64_t>(p);
    case DataType::Float32:
      return valueAs<float>(p);
    case DataType::Float64:
      return valueAs<double>(p);
    case DataType::Float16:
    case DataType::BFloat16: {
      uint16_t bits;
      std::memcpy(&bits, p, sizeof bits);
      return type == DataType::Float16 ? halfToFloat(bits) : bf16ToFloat(bits);
    }
  }
  unknownType("elementAsDouble", type);
}

}  // namespace strata
