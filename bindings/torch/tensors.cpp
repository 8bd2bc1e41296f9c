// The checks every call makes on the caller's thread, so that an unsupported type, op or shape
// raises at the call and never reaches the worker.

#include <cstddef>
#include <string>
#include <string_view>

#include <c10/util/Exception.h>

#include "internal.hpp"

namespace strata::torchbind {
namespace {

constexpr const char* kSupportedTypes =
    "float32, float64, float16, bfloat16, int8, uint8, int32, int64 and bool";

std::string typeName(const at::Tensor& t) {
  return std::string(c10::toString(t.scalar_type()));
}

}  // namespace

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

void checkEachLike(const std::vector<at::Tensor>& list, const at::Tensor& like, const char* what,
                   const char* listSide) {
  const char* likeSide = std::string_view(listSide) == "output" ? "input" : "output";
  for (const auto& t : list) {
    typeOf(t, what);
    checkSameType(t, like, what);
    TORCH_CHECK(t.numel() == like.numel(), "strata: ", what, ": an ", listSide, " tensor has ",
                t.numel(), " elements, the ", likeSide, " ", like.numel());
  }
}

}  // namespace strata::torchbind
