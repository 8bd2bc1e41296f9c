#pragma once

// Element-wise reduction kernels of the host collectives.
//
// Semantics shared by all three functions:
// - Pointers may have any alignment; count may be anything (0 does nothing).
// - Integer Sum and Prod wrap modulo 2^bits (computed unsigned), Min and Max compare signed or
//   unsigned as the type says.
// - Float16 and BFloat16 are converted to fp32, combined there and rounded back to nearest even
//   (float16.hpp); Float32 is combined in float, Float64 in double.
// - Float Min and Max propagate NaN: if either operand is a NaN, the result is a NaN (the one from
//   the source when both are; payloads may therefore depend on the fold order). Between equal
//   operands (including -0 and +0) the accumulator is kept, so min(-0, +0) is whatever was folded
//   first. No fmin/fmax: those drop NaNs and do not vectorize without -ffast-math.
// - Avg reduces as Sum; the caller finishes with divideBy (NCCL's definition of Avg).
// - On x86-64 CPUs with F16C and AVX2, Float16 and BFloat16 run in hand-vectorized kernels
//   (picked at run time) that give the same bits as the portable ones, with one exception forced
//   by the hardware: vcvtph2ps quiets a signalling fp16 NaN (sets 0x200), so where the portable
//   code passes one through unchanged (Min, Max, reduceMany with n == 1) the result may be the
//   quiet NaN with the same sign and payload instead. Arithmetic quiets it on every path anyway.

#include <cstddef>

#include <strata/types.hpp>

namespace strata::collectives {

/// dst[i] = op(dst[i], src[i]) for i < count. dst and src must not partially overlap
/// (dst == src is allowed).
void reduceInto(void* dst, const void* src, size_t count, DataType type, ReduceOp op);

/// dst[i] = op over k = 0..n-1 of srcs[k][i], folded in that order, so every caller with the same
/// sources gets bit-identical results. n >= 1. dst may be any of srcs[k] (or none of them) and
/// must not partially overlap them. Float16/BFloat16 accumulate all n sources in fp32 and round
/// once at the end.
void reduceMany(void* dst, const void* const* srcs, size_t n, size_t count, DataType type,
                ReduceOp op);

/// NCCL's Avg finish: data[i] = data[i] / divisor. Integer types use truncating integer division
/// (-7 / 2 == -3); Float16 and BFloat16 divide in fp32 and round, Float32 in float, Float64 in
/// double. divisor must be >= 1 (InvalidArgument otherwise).
void divideBy(void* data, size_t count, DataType type, int divisor);

}  // namespace strata::collectives
