// Compile check: the channel handles (<strata/channel.hpp>, <strata/device.hpp>) must build under
// nvcc for device code as well as for the host pass. The kernels below touch every device-side
// method of MemoryChannel, PortChannel and FifoDeviceHandle. The object is built by the 'gpu'
// suite (tests/gpu/meson.build) and never run: correctness is covered on the CPU by the unit
// test `channels` (tests/unit/transport/), which runs the same code in host threads.

#include <cstddef>
#include <cstdint>

#include <strata/channel.hpp>
#include <strata/device.hpp>

namespace {

// One block cooperates on the copies (threadId/numThreads from the CUDA grid), then thread 0
// signals and waits, as a collective kernel would after __syncthreads().
__global__ void memoryChannelKernel(strata::MemoryChannel channel, char* scratch, size_t bytes,
                                    int* result) {
  const uint32_t tid = threadIdx.x;
  const uint32_t nthreads = blockDim.x;
  channel.put(0, 0, bytes, tid, nthreads);
  channel.putFrom(bytes, scratch, bytes, tid, nthreads);
  channel.get(0, bytes, bytes, tid, nthreads);
  channel.getTo(scratch, bytes, bytes, tid, nthreads);
  strata::device::copySplit(scratch, channel.local, bytes, tid, nthreads);
  __syncthreads();
  if (tid == 0) {
    channel.signal();
    int ok = channel.wait(1 << 20) ? 1 : 0;
    ok += channel.poll() ? 2 : 0;
    strata::device::fenceSystem();
    uint64_t seen = strata::device::loadAcquire(channel.inbound);
    strata::device::storeRelease(channel.inbound, seen);
    strata::device::fetchAdd(channel.remoteInbound, 0);
    strata::device::spinPause();
    *result = ok;
  }
}

// A GPU producer of proxy triggers: the non-blocking forms, then the blocking ones, then the
// raw FIFO handle, and the semaphore side of the channel.
__global__ void portChannelKernel(strata::PortChannel channel, strata::FifoDeviceHandle fifo,
                                  uint64_t* ids, int* result) {
  if (threadIdx.x != 0) return;
  int ok = 0;
  uint64_t id = 0;
  ok += channel.tryPut(0, 0, 64, &id) ? 1 : 0;
  ids[0] = id;
  ok += channel.trySignal(&id) ? 1 : 0;
  ids[1] = id;
  ok += channel.tryPutWithSignal(64, 64, 64, &id) ? 1 : 0;
  ids[2] = id;
  ok += channel.tryFlush(&id) ? 1 : 0;
  ids[3] = id;
  ids[4] = channel.put(128, 128, 64);
  ids[5] = channel.signal();
  ids[6] = channel.putWithSignal(192, 192, 64);
  ok += channel.flush(1 << 20) ? 1 : 0;

  strata::ProxyTrigger trigger;
  trigger.type = strata::TriggerType::Flush;
  trigger.channel = channel.channel;
  if (fifo.tryPush(trigger, &id)) {
    ids[7] = id;
    ok += fifo.sync(id, 1 << 20) ? 1 : 0;
  }
  ok += fifo.done(ids[0]) ? 1 : 0;
  ok += channel.poll() ? 1 : 0;
  ok += channel.wait(16) ? 1 : 0;
  *result = ok;
}

}  // namespace

// Host pass: the same handles from host code in a .cu translation unit, and the launches (the
// object is never linked or run, so no device is needed).
int launchChannelChecks(strata::MemoryChannel memory, strata::PortChannel port, char* scratch,
                        uint64_t* ids, int* result) {
  memoryChannelKernel<<<1, 128>>>(memory, scratch, 4096, result);
  portChannelKernel<<<1, 32>>>(port, port.fifo, ids, result + 1);
  uint64_t id = 0;
  bool pushed = port.tryFlush(&id);
  memory.put(0, 0, 16);
  return (pushed && port.fifo.done(id) ? 1 : 0) + (memory.poll() ? 1 : 0) +
         (cudaDeviceSynchronize() == cudaSuccess ? 1 : 0);
}
