// cuda_baseline: what one GPU of this machine does without strata, to read strata-perf
// --memory cuda numbers against (tools/dev/gpu-check.sh builds and runs it):
//   - cudaMemcpy device to device at 1, 16 and 256 MiB: bytes copied per second (each byte is
//     read once and written once, so the memory traffic is twice that), best and mean of the
//     timed copies (cudaEvent timing, after a warm-up copy);
//   - an empty kernel <<<1, 1>>> launched and waited for with cudaStreamSynchronize: mean and
//     minimum of 1000, on the host clock (a collective's floor on one stream is at least this).
// With --preflight it only says what the GPU check needs to know first, in well under a second:
// the devices, compute mode, driver and runtime, and cudaDeviceCanAccessPeer for every pair.
// Exit status: 0, 1 on a CUDA error, 77 without a CUDA device or driver (one line says why).
//
//   nvcc -O2 -std=c++17 -arch=native -o cuda_baseline tools/bench/cuda_baseline.cu

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

void check(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return;
  std::fprintf(stderr, "cuda_baseline: %s failed: %s\n", what, cudaGetErrorString(rc));
  std::exit(1);
}

__global__ void empty() {}

}  // namespace

int preflight(int count) {
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("driver %d, runtime %d, %d device(s)\n", driver, runtime, count);
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, d), "cudaGetDeviceProperties");
    int mode = 0;
    check(cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, d), "cudaDeviceGetAttribute");
    std::printf("device %d: %s, sm_%d%d, %d SMs, compute mode %d (0 default, 2 prohibited, 3 "
                "exclusive process)\n",
                d, prop.name, prop.major, prop.minor, prop.multiProcessorCount, mode);
  }
  for (int a = 0; a < count; ++a) {
    for (int b = 0; b < count; ++b) {
      if (a == b) continue;
      int can = 0;
      check(cudaDeviceCanAccessPeer(&can, a, b), "cudaDeviceCanAccessPeer");
      std::printf("peer access %d -> %d: %s\n", a, b, can ? "yes" : "no");
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count == 0) {
    std::fprintf(stderr, "cuda_baseline: needs a CUDA device: %s (skipped)\n",
                 rc != cudaSuccess ? cudaGetErrorString(rc) : "no CUDA device is visible");
    return 77;
  }
  if (argc > 1 && std::strcmp(argv[1], "--preflight") == 0) return preflight(count);
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf(
      "# cuda_baseline: device 0 of %d: %s (sm_%d%d, %d SMs, %.0f GiB), driver %d, runtime %d\n",
      count, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
      static_cast<double>(prop.totalGlobalMem) / (1u << 30), driver, runtime);

  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");

  std::printf("# cudaMemcpy device to device (GB = 1e9 B; bytes copied, read + write is twice)\n");
  std::printf("# %10s %6s %12s %12s %12s\n", "size(B)", "reps", "best(us)", "mean(us)",
              "best(GB/s)");
  const size_t maxBytes = size_t{256} << 20;
  void* src = nullptr;
  void* dst = nullptr;
  check(cudaMalloc(&src, maxBytes), "cudaMalloc");
  check(cudaMalloc(&dst, maxBytes), "cudaMalloc");
  check(cudaMemset(src, 1, maxBytes), "cudaMemset");
  for (size_t bytes : {size_t{1} << 20, size_t{16} << 20, size_t{256} << 20}) {
    const int reps = bytes >= (size_t{256} << 20) ? 10 : 50;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    float best = 1e30f, total = 0;
    for (int i = 0; i < reps; ++i) {
      check(cudaEventRecord(start, stream), "cudaEventRecord");
      check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
      check(cudaEventRecord(stop, stream), "cudaEventRecord");
      check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      best = std::min(best, ms);
      total += ms;
    }
    std::printf("  %10zu %6d %12.2f %12.2f %12.1f\n", bytes, reps, best * 1e3, total / reps * 1e3,
                static_cast<double>(bytes) / (best * 1e-3) / 1e9);
  }

  const int launches = 1000;
  for (int i = 0; i < 10; ++i) empty<<<1, 1, 0, stream>>>();
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (warm-up)");
  double sum = 0, min = 1e30;
  for (int i = 0; i < launches; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    empty<<<1, 1, 0, stream>>>();
    check(cudaGetLastError(), "kernel launch");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    sum += us;
    min = std::min(min, us);
  }
  std::printf("# empty kernel <<<1,1>>> launch + cudaStreamSynchronize, %d times (host clock)\n",
              launches);
  std::printf("  launch+sync mean %.2f us, min %.2f us\n", sum / launches, min);

  cudaFree(src);
  cudaFree(dst);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  return 0;
}
