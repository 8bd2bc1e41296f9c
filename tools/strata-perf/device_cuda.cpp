// device.hpp with the CUDA runtime (built when meson finds CUDA).

#include <cuda_runtime_api.h>

#include <fmt/format.h>
#include <strata/error.hpp>

#include "device.hpp"

namespace strata::perf::device {

namespace {

void check(cudaError_t rc, const char* call) {
  if (rc == cudaSuccess) return;
  throw Error(ErrorCode::SystemError, fmt::format("{} failed: {} ({})", call,
                                                  cudaGetErrorString(rc), cudaGetErrorName(rc)));
}

cudaStream_t asStream(void* stream) {
  return static_cast<cudaStream_t>(stream);
}

}  // namespace

bool built() noexcept {
  return true;
}

Probe probe() noexcept {
  Probe p;
  const cudaError_t rc = cudaGetDeviceCount(&p.count);
  if (rc != cudaSuccess) {
    p.count = 0;
    p.error = cudaGetErrorString(rc);
  } else if (p.count <= 0) {
    p.count = 0;
    p.error = "no CUDA device is visible";
  }
  return p;
}

Info select(int index) {
  check(cudaSetDevice(index), "cudaSetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
  Info info;
  info.index = index;
  info.pciBus = prop.pciBusID;
  info.name = prop.name;
  return info;
}

void* createStream() {
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return stream;
}

void destroyStream(void* stream) noexcept {
  if (stream) cudaStreamDestroy(asStream(stream));
}

void synchronize(void* stream) {
  check(cudaStreamSynchronize(asStream(stream)), "cudaStreamSynchronize");
}

void* allocate(size_t bytes) {
  void* p = nullptr;
  const cudaError_t rc = cudaMalloc(&p, bytes);
  if (rc != cudaSuccess) {
    throw Error(ErrorCode::SystemError, fmt::format("cudaMalloc of {} bytes failed: {}; lower -e",
                                                    bytes, cudaGetErrorString(rc)));
  }
  return p;
}

void release(void* pointer) noexcept {
  if (pointer) cudaFree(pointer);
}

void toDevice(void* device, const void* host, size_t bytes, void* stream) {
  check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, asStream(stream)),
        "cudaMemcpyAsync (host to device)");
  synchronize(stream);
}

void toHost(void* host, const void* device, size_t bytes, void* stream) {
  check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, asStream(stream)),
        "cudaMemcpyAsync (device to host)");
  synchronize(stream);
}

void zero(void* device, size_t bytes, void* stream) {
  check(cudaMemsetAsync(device, 0, bytes, asStream(stream)), "cudaMemsetAsync");
  synchronize(stream);
}

void copyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, asStream(stream)),
        "cudaMemcpyAsync (device to device)");
}

Graph::~Graph() {
  if (capturing_) {
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(asStream(stream_), &partial) == cudaSuccess && partial) {
      cudaGraphDestroy(partial);
    }
    cudaGetLastError();  // the capture's error is the one already being reported
  }
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}

void Graph::begin(void* stream) {
  stream_ = stream;
  check(cudaStreamBeginCapture(asStream(stream), cudaStreamCaptureModeGlobal),
        "cudaStreamBeginCapture");
  capturing_ = true;
}

void Graph::end() {
  cudaGraph_t graph = nullptr;
  capturing_ = false;
  check(cudaStreamEndCapture(asStream(stream_), &graph),
        "cudaStreamEndCapture (a call during the capture was not capturable)");
  graph_ = graph;
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  exec_ = exec;
}

void Graph::launch(void* stream) {
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), asStream(stream)), "cudaGraphLaunch");
}

}  // namespace strata::perf::device
