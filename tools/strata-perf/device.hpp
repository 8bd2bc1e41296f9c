#pragma once

// The CUDA runtime calls of strata-perf's --memory cuda, behind plain types so that the modes
// compile without CUDA headers. device_cuda.cpp implements them when meson finds CUDA;
// device_none.cpp otherwise (built() is false and every other call throws NotSupported).
// Every failing CUDA call throws strata::Error (SystemError) naming the call and
// cudaGetErrorString.

#include <cstddef>
#include <string>

namespace strata::perf::device {

/// Whether this strata-perf was built with the CUDA runtime.
bool built() noexcept;

/// The outcome of cudaGetDeviceCount: count > 0, or count 0 and why (cudaGetErrorString of its
/// error, or "no CUDA device is visible" when it succeeds with 0). Touches no device and needs no
/// other rank, so every rank can decide before the bootstrap.
struct Probe {
  int count = 0;
  std::string error;
};
Probe probe() noexcept;

struct Info {
  int index = 0;
  int pciBus = 0;
  std::string name;  ///< "NVIDIA H200"
};
/// cudaSetDevice(index) and what it is.
Info select(int index);

/// A cudaStream_t (non-blocking) as a plain pointer (strata::Stream's handle).
void* createStream();
void destroyStream(void* stream) noexcept;
/// Waits for everything enqueued on the stream; throws on an error the work left.
void synchronize(void* stream);

void* allocate(size_t bytes);
void release(void* pointer) noexcept;
/// Copies enqueued on the stream, then synchronize(stream): the data is in place on return and
/// ordered with the collectives on that stream.
void toDevice(void* device, const void* host, size_t bytes, void* stream);
void toHost(void* host, const void* device, size_t bytes, void* stream);
/// cudaMemsetAsync(device, 0, bytes), then synchronize(stream).
void zero(void* device, size_t bytes, void* stream);
/// Device to device, enqueued on the stream (sendrecv with one rank).
void copyAsync(void* dst, const void* src, size_t bytes, void* stream);

/// A CUDA graph captured from the stream (cudaStreamCaptureModeGlobal): begin(), the calls to
/// capture, end() (instantiates), then launch() any number of times. Destroyed during a capture
/// (a captured call threw), it ends the capture, so that the stream is usable again.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void begin(void* stream);
  void end();
  void launch(void* stream);

 private:
  void* stream_ = nullptr;
  bool capturing_ = false;
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

}  // namespace strata::perf::device
