#pragma once

// What the files of strata_torch share (not installed): the checks every call makes on the
// caller's thread before it queues (tensors.cpp), how a tensor reaches strata, and how values
// cross torch's Store.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <strata/communicator.hpp>

namespace strata::torchbind {

// --- checks on the caller's thread: each raises a RuntimeError that names the call (`what`) ---

/// The strata type of a tensor, or a RuntimeError naming what is supported.
DataType typeOf(const at::Tensor& t, const char* what);

/// The strata reduction for a torch op on this tensor type.
ReduceOp reduceOpOf(const c10d::ReduceOp& op, const at::Tensor& t, const char* what);

/// The one tensor of a call that takes a list (strata serves one device per process).
const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* what);

void checkRoot(int64_t root, int size, const char* what);

void checkSameType(const at::Tensor& a, const at::Tensor& b, const char* what);

/// The per-rank tensors of a call (`listSide` "output" or "input") each have the type and the
/// element count of `like`, the tensor on the other side.
void checkEachLike(const std::vector<at::Tensor>& list, const at::Tensor& like, const char* what,
                   const char* listSide);

// --- a tensor as strata's buffers ---

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

inline void* dataOf(at::Tensor& t) {
  return t.numel() == 0 ? nullptr : t.data_ptr();
}
inline size_t countOf(const at::Tensor& t) {
  return static_cast<size_t>(t.numel());
}

// --- values through torch's Store, durations in messages ---

inline std::vector<uint8_t> bytesOf(const std::string& s) {
  return {s.begin(), s.end()};
}
inline std::string stringOf(const std::vector<uint8_t>& b) {
  return {b.begin(), b.end()};
}

inline std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream s;
  s << static_cast<double>(ms.count()) / 1000.0;  // "60", "0.5"
  return s.str();
}

}  // namespace strata::torchbind
