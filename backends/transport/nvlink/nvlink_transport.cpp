#include "nvlink_transport.hpp"

#include <poll.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include <strata/backend/module.hpp>
#include <strata/error.hpp>
#include <strata/version.hpp>

#include "base/config_keys.hpp"
#include "base/deadline.hpp"
#include "base/log.hpp"
#include "nvlink_check.hpp"

namespace strata::nvlink {
namespace {

constexpr const char* kLog = "nvlink";
/// Pinned 8-byte slots per connection for updateAndSync(); a slot is reused only after the
/// copy that read it has run (an event per slot says so).
constexpr size_t kSignalSlots = 64;

// Not strata::toString(MemoryKind): the module should load against any libstrata of this ABI.
const char* kindName(MemoryKind kind) noexcept {
  return kind == MemoryKind::Cuda ? "cuda" : kind == MemoryKind::Host ? "host" : "unknown";
}

std::string describeOwner(const backend::PeerInfo& owner, const MemoryDescriptor& d) {
  return fmt::format("rank {} (pid {}, GPU {} at {})", owner.rank, d.pid, uuidString(d.deviceUuid),
                     d.pciBusId);
}

/// Waits for a CUDA event or stream with short sleeps; cudaSuccess, cudaErrorNotReady (deadline
/// passed) or the error the query returned.
template <typename Query>
cudaError_t pollUntil(Query query, const Deadline& deadline) {
  for (int i = 0;; ++i) {
    cudaError_t err = query();
    if (err != cudaErrorNotReady) return err;
    if (deadline.expired()) return cudaErrorNotReady;
    // Yield first (a small copy lands in microseconds), then sleep up to 200 us so that a long
    // copy does not burn a core the ranks may share.
    if (i < 32) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(i < 64 ? 20 : 200));
    }
  }
}

class NvlinkLocalMemory final : public backend::LocalMemory {
 public:
  NvlinkLocalMemory(std::vector<uint8_t> record, std::shared_ptr<Counters> counters)
      : record_(std::move(record)), counters_(std::move(counters)) {
    ++counters_->registrations;
  }
  ~NvlinkLocalMemory() override { --counters_->registrations; }
  std::vector<uint8_t> descriptor() const override { return record_; }

 private:
  std::vector<uint8_t> record_;
  std::shared_ptr<Counters> counters_;
};

class NvlinkRemoteMemory final : public backend::RemoteMemory {
 public:
  enum class Mapping { SameProcess, RuntimeIpc, Fabric };

  NvlinkRemoteMemory(Mapping mapping, void* base, size_t mappedSize, uint64_t offset, int device,
                     int ownerRank, std::shared_ptr<Counters> counters)
      : mapping_(mapping),
        base_(base),
        mappedSize_(mappedSize),
        offset_(offset),
        device_(device),
        ownerRank_(ownerRank),
        counters_(std::move(counters)) {
    ++counters_->imports;
  }

  ~NvlinkRemoteMemory() override {
    // Never throws: a failed close is logged and the mapping is leaked.
    DeviceGuard guard(device_);
    if (mapping_ == Mapping::RuntimeIpc) {
      cudaError_t err = cudaIpcCloseMemHandle(base_);
      if (err != cudaSuccess) {
        clearCudaError();
        STRATA_LOG(Warn, kLog, "cudaIpcCloseMemHandle of rank {}'s buffer failed: {}", ownerRank_,
                   cudaErrorText(err));
      }
    } else if (mapping_ == Mapping::Fabric) {
      try {
        const Driver& drv = driver();
        auto va = reinterpret_cast<CUdeviceptr>(base_);
        CUresult res = drv.memUnmap(va, mappedSize_);
        if (res == CUDA_SUCCESS) res = drv.memAddressFree(va, mappedSize_);
        if (res != CUDA_SUCCESS) {
          STRATA_LOG(Warn, kLog, "unmapping rank {}'s fabric buffer failed: {}", ownerRank_,
                     drv.errorText(res));
        }
      } catch (...) {
      }
    }
    --counters_->imports;
  }

  void* devicePointer() const noexcept override { return static_cast<char*>(base_) + offset_; }

 private:
  Mapping mapping_;
  void* base_;  // the start of the mapping (the allocation base as seen here)
  size_t mappedSize_;
  uint64_t offset_;
  int device_;
  int ownerRank_;
  std::shared_ptr<Counters> counters_;
};

class NvlinkConnection final : public backend::TransportConnection {
 public:
  NvlinkConnection(const backend::PeerInfo& peer, int device, double timeoutSeconds,
                   std::shared_ptr<Counters> counters)
      : peer_(peer), device_(device), timeoutSeconds_(timeoutSeconds), counters_(counters) {
    DeviceGuard guard(device_);
    try {
      checkCuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                "creating the connection's CUDA stream", peer_.rank);
      void* slots = nullptr;
      checkCuda(cudaHostAlloc(&slots, kSignalSlots * sizeof(uint64_t), cudaHostAllocPortable),
                "allocating pinned signal slots", peer_.rank);
      slots_ = static_cast<uint64_t*>(slots);
      for (auto& ev : events_) {
        checkCuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming),
                  "creating a signal-slot event", peer_.rank);
      }
    } catch (...) {
      release(true);
      throw;
    }
    if (peer_.pid > 0) {
      pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, peer_.pid, 0));
      if (pidfd_ < 0) {
        if (errno == ESRCH) {
          lost_ = true;
        } else {
          // Old kernel (< 5.3) or a seccomp filter: checkPeer() then cannot tell.
          STRATA_LOG(Debug, kLog, "pidfd_open({}) for rank {} failed: {}", peer_.pid, peer_.rank,
                     std::strerror(errno));
        }
      }
    }
    ++counters_->connections;
  }

  ~NvlinkConnection() override {
    DeviceGuard guard(device_);
    // The pinned slots must outlive the copies that read them: drain the stream first, and
    // leak the slots if it does not drain in time.
    cudaError_t err =
        pollUntil([&] { return cudaStreamQuery(stream_); }, Deadline::fromTimeout(timeoutSeconds_));
    bool drained = err == cudaSuccess;
    if (!drained) {
      clearCudaError();
      STRATA_LOG(Warn, kLog,
                 "closing the connection to rank {}: copies still pending or failed ({}); "
                 "leaking its pinned signal slots",
                 peer_.rank, err == cudaErrorNotReady ? "timeout" : cudaErrorText(err));
    }
    release(drained);
    if (pidfd_ >= 0) close(pidfd_);
    --counters_->connections;
  }

  void write(const backend::RemoteRef& dst, uint64_t dstOffset, const backend::LocalRef& src,
             uint64_t srcOffset, size_t bytes) override {
    if (bytes == 0) return;
    checkLost();
    char* to = remotePointer(dst, "write");
    const char* from = static_cast<const char*>(src.data) + srcOffset;
    auto kind = src.kind == MemoryKind::Host ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice;
    DeviceGuard guard(device_);
    checkCuda(cudaMemcpyAsync(to + dstOffset, from, bytes, kind, stream_),
              fmt::format("cudaMemcpyAsync of {} bytes to rank {}", bytes, peer_.rank), peer_.rank);
  }

  void updateAndSync(const backend::RemoteRef& dst, uint64_t dstOffset, uint64_t value) override {
    checkLost();
    char* to = remotePointer(dst, "updateAndSync");
    DeviceGuard guard(device_);
    size_t i = next_++ % kSignalSlots;
    // Reuse the slot only once the copy that last read it has run.
    cudaError_t err = pollUntil([&] { return cudaEventQuery(events_[i]); },
                                Deadline::fromTimeout(timeoutSeconds_));
    if (err == cudaErrorNotReady) {
      throw Error(ErrorCode::Timeout,
                  fmt::format("nvlink: updateAndSync to rank {} waited {} s for a signal slot: "
                              "the connection's CUDA stream made no progress (a hung kernel or "
                              "copy on this GPU?); raise transport.timeout if copies are just slow",
                              peer_.rank, timeoutSeconds_),
                  peer_.rank);
    }
    checkCuda(err, "waiting for a signal slot", peer_.rank);
    slots_[i] = value;
    // Stream order: this 8-byte copy starts after every earlier copy on the stream finished.
    checkCuda(cudaMemcpyAsync(to + dstOffset, &slots_[i], sizeof(uint64_t), cudaMemcpyHostToDevice,
                              stream_),
              fmt::format("cudaMemcpyAsync of a signal to rank {}", peer_.rank), peer_.rank);
    checkCuda(cudaEventRecord(events_[i], stream_), "recording a signal-slot event", peer_.rank);
  }

  void flush(double deadlineSeconds) override {
    DeviceGuard guard(device_);
    Deadline deadline = Deadline::fromTimeout(deadlineSeconds);
    cudaError_t err = pollUntil([&] { return cudaStreamQuery(stream_); }, deadline);
    if (err == cudaErrorNotReady) {
      throw Error(ErrorCode::Timeout,
                  fmt::format("nvlink: flush to rank {} timed out after {} s with copies still "
                              "pending on the connection's CUDA stream; check that the GPU is "
                              "not hung or oversubscribed, or raise transport.timeout",
                              peer_.rank, deadlineSeconds),
                  peer_.rank);
    }
    checkCuda(err, fmt::format("flush to rank {} (cudaStreamQuery)", peer_.rank), peer_.rank);
  }

  void checkPeer() override { checkLost(); }

 private:
  char* remotePointer(const backend::RemoteRef& dst, const char* op) const {
    void* p = dst.memory ? dst.memory->devicePointer() : nullptr;
    if (!p || dst.kind != MemoryKind::Cuda) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("nvlink: {} to rank {}: the destination is not CUDA memory "
                              "imported by the nvlink transport",
                              op, peer_.rank),
                  peer_.rank);
    }
    return static_cast<char*>(p);
  }

  void checkLost() {
    if (!lost_ && pidfd_ >= 0) {
      pollfd pfd{pidfd_, POLLIN, 0};
      // A pidfd becomes readable when the process exits.
      if (poll(&pfd, 1, 0) > 0) lost_ = true;
    }
    if (lost_) {
      throw Error(ErrorCode::PeerLost,
                  fmt::format("nvlink: rank {} (pid {}) has exited; its GPU memory is gone and "
                              "the connection cannot be used",
                              peer_.rank, peer_.pid),
                  peer_.rank);
    }
  }

  void release(bool freeSlots) noexcept {
    for (auto& ev : events_) {
      if (ev) cudaEventDestroy(ev);
      ev = nullptr;
    }
    if (slots_ && freeSlots) cudaFreeHost(slots_);
    slots_ = nullptr;
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
    clearCudaError();
  }

  backend::PeerInfo peer_;
  int device_;
  double timeoutSeconds_;
  std::shared_ptr<Counters> counters_;
  cudaStream_t stream_ = nullptr;
  uint64_t* slots_ = nullptr;
  std::array<cudaEvent_t, kSignalSlots> events_{};
  size_t next_ = 0;
  int pidfd_ = -1;
  bool lost_ = false;
};

}  // namespace

NvlinkTransport::NvlinkTransport(const backend::TransportInit& init)
    : hostId_(init.hostId), rank_(init.rank) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    clearCudaError();
    throw Error(ErrorCode::NotSupported,
                fmt::format("no CUDA device: {}; the nvlink transport needs a visible GPU and "
                            "the NVIDIA driver (check nvidia-smi and CUDA_VISIBLE_DEVICES)",
                            err != cudaSuccess ? cudaErrorText(err) : "cudaGetDeviceCount says 0"));
  }
  if (init.config) timeoutSeconds_ = config::getDouble(*init.config, "transport.timeout");
  // The user selects the device before creating the transport (as with NCCL).
  int current = 0;
  checkCuda(cudaGetDevice(&current), "cudaGetDevice");
  for (int i = 0; i < count; ++i) visible_.push_back(identityOf(i));
  self_ = visible_.at(current);
  (void)driver();  // NotSupported now rather than at the first registration
  DeviceGuard guard(self_.ordinal);
  checkCuda(cudaStreamCreateWithFlags(&signalStream_, cudaStreamNonBlocking),
            "creating the signal stream");
  void* slot = nullptr;
  err = cudaHostAlloc(&slot, sizeof(uint64_t), cudaHostAllocPortable);
  if (err != cudaSuccess) {
    cudaStreamDestroy(signalStream_);
    checkCuda(err, "allocating a pinned signal word");
  }
  signalSlot_ = static_cast<uint64_t*>(slot);
  STRATA_LOG(Debug, kLog, "rank {}: nvlink transport on device {} ({} at {}), {} visible", rank_,
             self_.ordinal, uuidString(self_.uuid), self_.pciBusId, count);
}

NvlinkTransport::~NvlinkTransport() {
  DeviceGuard guard(self_.ordinal);
  if (signalStream_) {
    cudaStreamSynchronize(signalStream_);
    cudaStreamDestroy(signalStream_);
  }
  if (signalSlot_) cudaFreeHost(signalSlot_);
  clearCudaError();
}

DeviceIdentity NvlinkTransport::identityOf(int ordinal) const {
  DeviceIdentity id;
  id.ordinal = ordinal;
  cudaDeviceProp prop{};
  checkCuda(cudaGetDeviceProperties(&prop, ordinal),
            fmt::format("cudaGetDeviceProperties of device {}", ordinal));
  std::memcpy(id.uuid.data(), prop.uuid.bytes, id.uuid.size());
  char bus[kMaxBusIdBytes + 1] = {};
  checkCuda(cudaDeviceGetPCIBusId(bus, sizeof(bus) - 1, ordinal),
            fmt::format("cudaDeviceGetPCIBusId of device {}", ordinal));
  id.pciBusId = bus;
  return id;
}

const DeviceIdentity* NvlinkTransport::findDevice(const Uuid& uuid) const {
  for (const auto& d : visible_) {
    if (d.uuid == uuid) return &d;
  }
  return nullptr;
}

void* NvlinkTransport::allocate(size_t bytes, MemoryKind kind) {
  if (kind != MemoryKind::Cuda) return nullptr;
  DeviceGuard guard(self_.ordinal);
  void* p = nullptr;
  checkCuda(cudaMalloc(&p, bytes == 0 ? 1 : bytes),
            fmt::format("cudaMalloc of {} bytes on device {}", bytes, self_.ordinal));
  return p;
}

void NvlinkTransport::deallocate(void* data, MemoryKind kind) noexcept {
  if (kind != MemoryKind::Cuda || !data) return;
  DeviceGuard guard(self_.ordinal);
  cudaError_t err = cudaFree(data);
  if (err != cudaSuccess) {
    clearCudaError();
    STRATA_LOG(Warn, kLog, "cudaFree({}) failed: {}", data, cudaErrorText(err));
  }
}

std::unique_ptr<backend::LocalMemory> NvlinkTransport::registerMemory(
    void* data, size_t bytes, MemoryKind kind, const backend::HostAllocation* /*host*/) {
  if (kind != MemoryKind::Cuda) {
    throw Error(ErrorCode::NotSupported,
                fmt::format("nvlink: cannot register {} memory; the nvlink transport shares CUDA "
                            "device memory only (use shm for host buffers)",
                            kindName(kind)));
  }
  const Driver& drv = driver();
  DeviceGuard guard(self_.ordinal);
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, data);
  if (err != cudaSuccess || attr.type != cudaMemoryTypeDevice) {
    clearCudaError();
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("nvlink: {} is not CUDA device memory ({}); register memory from "
                            "cudaMalloc or Context::allocate(bytes, MemoryKind::Cuda)",
                            data, err != cudaSuccess ? cudaErrorText(err) : "another memory type"));
  }
  CUdeviceptr base = 0;
  size_t allocationSize = 0;
  CUresult res =
      drv.memGetAddressRange(&base, &allocationSize, reinterpret_cast<CUdeviceptr>(data));
  if (res != CUDA_SUCCESS) {
    throw Error(ErrorCode::BackendError, fmt::format("nvlink: cuMemGetAddressRange({}) failed: {}",
                                                     data, drv.errorText(res)));
  }
  MemoryDescriptor d;
  d.ownerAddress = reinterpret_cast<uint64_t>(data);
  d.allocationBase = base;
  d.allocationSize = allocationSize;
  d.offset = d.ownerAddress - base;
  d.length = bytes;
  if (bytes == 0 || d.offset + bytes > allocationSize) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("nvlink: {} bytes at {} run past the end of their CUDA allocation "
                            "({} bytes at {:#x})",
                            bytes, data, allocationSize, static_cast<uint64_t>(base)));
  }
  DeviceIdentity owner = attr.device == self_.ordinal ? self_ : identityOf(attr.device);
  d.deviceUuid = owner.uuid;
  d.pciBusId = owner.pciBusId;
  d.hostId = hostId_;
  d.pid = static_cast<int32_t>(getpid());

  // A fabric handle first (the importer tries handles in order): only cuMem allocations
  // created with CU_MEM_HANDLE_TYPE_FABRIC have one.
  std::string fabricNote = "no fabric handle support on this device";
  if (drv.fabricSupported(attr.device)) {
    CUmemGenericAllocationHandle handle{};
    if (drv.memRetainAllocationHandle(&handle, data) == CUDA_SUCCESS) {
      CUmemAllocationProp prop{};
      res = drv.memGetAllocationPropertiesFromHandle(&prop, handle);
      if (res == CUDA_SUCCESS && (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC)) {
        CUmemFabricHandle fabric{};
        res = drv.memExportToShareableHandle(&fabric, handle, CU_MEM_HANDLE_TYPE_FABRIC, 0);
        if (res == CUDA_SUCCESS) {
          const auto* b = reinterpret_cast<const uint8_t*>(&fabric);
          d.handles.push_back({static_cast<uint8_t>(HandleType::Fabric),
                               std::vector<uint8_t>(b, b + sizeof(fabric))});
        } else {
          fabricNote = "exporting the fabric handle failed: " + drv.errorText(res);
        }
      } else {
        fabricNote = "the cuMem allocation was not created with CU_MEM_HANDLE_TYPE_FABRIC";
      }
      drv.memRelease(handle);
    } else {
      fabricNote = "not a cuMem allocation";
    }
  }
  static_assert(sizeof(cudaIpcMemHandle_t) == kHandleBytes);
  static_assert(sizeof(CUmemFabricHandle) == kHandleBytes);
  cudaIpcMemHandle_t ipc{};
  err = cudaIpcGetMemHandle(&ipc, reinterpret_cast<void*>(base));
  std::string ipcNote;
  if (err == cudaSuccess) {
    const auto* b = reinterpret_cast<const uint8_t*>(&ipc);
    d.handles.push_back(
        {static_cast<uint8_t>(HandleType::RuntimeIpc), std::vector<uint8_t>(b, b + sizeof(ipc))});
  } else {
    clearCudaError();
    ipcNote = cudaErrorText(err);
  }
  if (d.handles.empty()) {
    throw Error(ErrorCode::NotSupported,
                fmt::format("nvlink: cannot share the CUDA buffer at {}: cudaIpcGetMemHandle "
                            "failed ({}) and it has no fabric handle ({}); allocate it with "
                            "cudaMalloc or Context::allocate(bytes, MemoryKind::Cuda)",
                            data, ipcNote, fabricNote));
  }
  STRATA_LOG(Trace, kLog, "registered {} bytes at {} (allocation {:#x}+{}, {} handle(s))", bytes,
             data, static_cast<uint64_t>(base), d.offset, d.handles.size());
  return std::make_unique<NvlinkLocalMemory>(encodeDescriptor(d), counters_);
}

std::unique_ptr<backend::RemoteMemory> NvlinkTransport::importMemory(
    const backend::PeerInfo& owner, std::span<const uint8_t> descriptor, size_t bytes,
    MemoryKind kind) {
  if (kind != MemoryKind::Cuda) {
    throw Error(ErrorCode::NotSupported,
                fmt::format("nvlink: rank {}'s buffer is {} memory; nvlink imports CUDA memory "
                            "only",
                            owner.rank, kindName(kind)),
                owner.rank);
  }
  MemoryDescriptor d;
  try {
    d = decodeDescriptor(descriptor);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{} (from rank {})", e.what(), owner.rank), owner.rank);
  }
  if ((owner.pid > 0 && d.pid != owner.pid) ||
      (owner.hostId != 0 && d.hostId != 0 && d.hostId != owner.hostId)) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("nvlink: the memory descriptor from rank {} names pid {} on host "
                            "{:#x}, but the bootstrap says rank {} is pid {} on host {:#x}",
                            owner.rank, d.pid, d.hostId, owner.rank, owner.pid, owner.hostId),
                owner.rank);
  }
  if (bytes > d.length) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("nvlink: rank {}'s buffer is {} bytes in its record but the nvlink "
                            "descriptor registers only {}",
                            owner.rank, bytes, d.length),
                owner.rank);
  }
  using Mapping = NvlinkRemoteMemory::Mapping;
  // The same process: CUDA refuses to open its own IPC handle, and the pointer is valid here;
  // when the owner's GPU is another one (a process that drives several GPUs, a rank per
  // thread), this GPU needs peer access to it, else the first kernel faults on the address.
  if (d.pid == static_cast<int32_t>(getpid()) && d.hostId == hostId_) {
    const DeviceIdentity* ownerGpu = findDevice(d.deviceUuid);
    if (ownerGpu == nullptr) {
      throw Error(ErrorCode::NotSupported,
                  fmt::format("nvlink: the buffer of {} is in this process but on a GPU this "
                              "process cannot see",
                              describeOwner(owner, d)),
                  owner.rank);
    }
    if (ownerGpu->ordinal != self_.ordinal) enablePeerAccess(ownerGpu->ordinal, owner, d);
    return std::make_unique<NvlinkRemoteMemory>(
        Mapping::SameProcess, reinterpret_cast<void*>(d.allocationBase), d.allocationSize, d.offset,
        self_.ordinal, owner.rank, counters_);
  }
  const DeviceIdentity* ownerDevice = findDevice(d.deviceUuid);
  std::string hidden = ownerDevice
                           ? ""
                           : fmt::format(
                                 "; the owner's GPU {} is not visible in this process (check "
                                 "CUDA_VISIBLE_DEVICES and the launcher's GPU binding)",
                                 uuidString(d.deviceUuid));
  DeviceGuard guard(self_.ordinal);
  std::string tried;
  if (const MemoryHandle* h = d.find(HandleType::Fabric)) {
    const Driver& drv = driver();
    if (drv.fabricSupported(self_.ordinal)) {
      CUmemFabricHandle fabric{};
      std::memcpy(&fabric, h->bytes.data(), sizeof(fabric));
      CUmemGenericAllocationHandle handle{};
      CUdeviceptr va = 0;
      CUresult res = drv.memImportFromShareableHandle(&handle, &fabric, CU_MEM_HANDLE_TYPE_FABRIC);
      bool imported = res == CUDA_SUCCESS, reserved = false, mapped = false;
      if (imported) {
        res = drv.memAddressReserve(&va, d.allocationSize, 0, 0, 0);
        reserved = res == CUDA_SUCCESS;
      }
      if (reserved) {
        res = drv.memMap(va, d.allocationSize, 0, handle, 0);
        mapped = res == CUDA_SUCCESS;
      }
      if (mapped) {
        CUmemAccessDesc access{};
        access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        access.location.id = self_.ordinal;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        res = drv.memSetAccess(va, d.allocationSize, &access, 1);
      }
      // The mapping holds the allocation; the handle itself is no longer needed.
      if (imported) drv.memRelease(handle);
      if (mapped && res == CUDA_SUCCESS) {
        return std::make_unique<NvlinkRemoteMemory>(Mapping::Fabric, reinterpret_cast<void*>(va),
                                                    d.allocationSize, d.offset, self_.ordinal,
                                                    owner.rank, counters_);
      }
      if (mapped) drv.memUnmap(va, d.allocationSize);
      if (reserved) drv.memAddressFree(va, d.allocationSize);
      tried = fmt::format("fabric handle: {}; ", drv.errorText(res));
      STRATA_LOG(Debug, kLog, "importing rank {}'s fabric handle failed ({}), trying runtime IPC",
                 owner.rank, drv.errorText(res));
    } else {
      tried = "fabric handle: not supported on this device; ";
    }
  }
  if (const MemoryHandle* h = d.find(HandleType::RuntimeIpc)) {
    cudaIpcMemHandle_t ipc{};
    std::memcpy(&ipc, h->bytes.data(), sizeof(ipc));
    void* p = nullptr;
    cudaError_t err = cudaIpcOpenMemHandle(&p, ipc, cudaIpcMemLazyEnablePeerAccess);
    if (err == cudaSuccess) {
      return std::make_unique<NvlinkRemoteMemory>(Mapping::RuntimeIpc, p, d.allocationSize,
                                                  d.offset, self_.ordinal, owner.rank, counters_);
    }
    clearCudaError();
    throw Error(ErrorCode::BackendError,
                fmt::format("nvlink: cannot map the buffer of {}: {}cudaIpcOpenMemHandle failed: "
                            "{}{}",
                            describeOwner(owner, d), tried, cudaErrorText(err), hidden),
                owner.rank);
  }
  throw Error(ErrorCode::NotSupported,
              fmt::format("nvlink: no handle in the descriptor of {} can be opened here ({}"
                          "no runtime IPC handle){}",
                          describeOwner(owner, d), tried, hidden),
              owner.rank);
}

void NvlinkTransport::enablePeerAccess(int ownerOrdinal, const backend::PeerInfo& owner,
                                       const MemoryDescriptor& d) {
  int can = 0;
  checkCuda(cudaDeviceCanAccessPeer(&can, self_.ordinal, ownerOrdinal), "cudaDeviceCanAccessPeer",
            owner.rank);
  if (can == 0) {
    throw Error(ErrorCode::NotSupported,
                fmt::format("nvlink: GPU {} (this rank's) cannot access GPU {} directly, where "
                            "the buffer of {} lives in this same process "
                            "(cudaDeviceCanAccessPeer = 0: no NVLink or PCIe P2P between "
                            "them); give each rank its own process, or use GPUs that are peers",
                            self_.ordinal, ownerOrdinal, describeOwner(owner, d)),
                owner.rank);
  }
  DeviceGuard guard(self_.ordinal);
  const cudaError_t e = cudaDeviceEnablePeerAccess(ownerOrdinal, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    clearCudaError();  // another rank of this process enabled it: fine
    return;
  }
  checkCuda(
      e,
      fmt::format("cudaDeviceEnablePeerAccess from GPU {} to GPU {}", self_.ordinal, ownerOrdinal),
      owner.rank);
}

std::vector<uint8_t> NvlinkTransport::endpoint() {
  Endpoint e;
  e.deviceUuid = self_.uuid;
  e.pciBusId = self_.pciBusId;
  e.hostId = hostId_;
  e.pid = static_cast<int32_t>(getpid());
  return encodeEndpoint(e);
}

std::unique_ptr<backend::TransportConnection> NvlinkTransport::connect(
    const backend::PeerInfo& peer, std::span<const uint8_t> peerEndpoint) {
  if (!peer.sameHost) {
    throw Error(ErrorCode::NotSupported,
                fmt::format("nvlink: rank {} runs on another host ({}); nvlink connects ranks on "
                            "one host only",
                            peer.rank, peer.hostName),
                peer.rank);
  }
  Endpoint e;
  try {
    e = decodeEndpoint(peerEndpoint);
  } catch (const Error& err) {
    throw Error(err.code(), fmt::format("{} (from rank {})", err.what(), peer.rank), peer.rank);
  }
  if (peer.pid > 0 && e.pid != peer.pid) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("nvlink: rank {}'s endpoint names pid {}, but the bootstrap says "
                            "pid {}",
                            peer.rank, e.pid, peer.pid),
                peer.rank);
  }
  const DeviceIdentity* dev = findDevice(e.deviceUuid);
  if (dev && dev->ordinal != self_.ordinal) {
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, self_.ordinal, dev->ordinal) != cudaSuccess) {
      clearCudaError();
    }
    STRATA_LOG(Debug, kLog, "rank {} uses GPU {} ({}), peer access from device {}: {}", peer.rank,
               uuidString(e.deviceUuid), e.pciBusId, self_.ordinal, can ? "yes" : "no");
  } else if (!dev) {
    STRATA_LOG(Debug, kLog,
               "rank {}'s GPU {} ({}) is not visible here; IPC goes through the "
               "driver",
               peer.rank, uuidString(e.deviceUuid), e.pciBusId);
  }
  backend::PeerInfo info = peer;
  if (info.pid <= 0) info.pid = e.pid;
  return std::make_unique<NvlinkConnection>(info, self_.ordinal, timeoutSeconds_, counters_);
}

uint64_t NvlinkTransport::loadSignal(const backend::LocalRef& mem, uint64_t offset) {
  if (mem.kind == MemoryKind::Host) return Transport::loadSignal(mem, offset);
  // A D2H copy of 8 bytes and a stream sync: several microseconds per call. Device-side
  // channels will read the word directly.
  std::lock_guard lock(signalMutex_);
  DeviceGuard guard(self_.ordinal);
  const char* src = static_cast<const char*>(mem.data) + offset;
  checkCuda(
      cudaMemcpyAsync(signalSlot_, src, sizeof(uint64_t), cudaMemcpyDeviceToHost, signalStream_),
      "reading a device signal word (cudaMemcpyAsync)");
  // The copy is a few microseconds; a poll with a deadline keeps the rule that no wait is
  // unbounded (a hung GPU makes this Timeout, not a hang).
  cudaError_t err = pollUntil([&] { return cudaStreamQuery(signalStream_); },
                              Deadline::fromTimeout(timeoutSeconds_));
  if (err == cudaErrorNotReady) {
    throw Error(ErrorCode::Timeout,
                fmt::format("nvlink: reading a device signal word did not finish within {} s; "
                            "the GPU may be hung",
                            timeoutSeconds_));
  }
  checkCuda(err, "reading a device signal word");
  return __atomic_load_n(signalSlot_, __ATOMIC_ACQUIRE);
}

backend::TransportStats NvlinkTransport::stats() const noexcept {
  backend::TransportStats s;
  s.registrations = counters_->registrations.load();
  s.imports = counters_->imports.load();
  s.connections = counters_->connections.load();
  return s;
}

namespace {

std::unique_ptr<backend::Transport> create(const backend::TransportInit& init) {
  return std::make_unique<NvlinkTransport>(init);
}

/// What CUDA says about this node's GPUs, for the pre-flight. None of these calls needs a
/// context (none is created), and none is made without a driver.
NodeFacts gatherFacts() {
  NodeFacts f;
  f.driver = ::access("/dev/nvidiactl", F_OK) == 0;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) f.visible = v;
  if (!f.driver) return f;
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    clearCudaError();
    f.error = cudaErrorText(e);
    return f;
  }
  // The driver's attribute call, for multicast (the runtime has no attribute for it).
  PFN_cuDeviceGetAttribute_v2000 driverAttribute = nullptr;
  PFN_cuDeviceGet_v2000 driverDevice = nullptr;
  try {
    driverAttribute = driver().deviceGetAttribute;
    driverDevice = driver().deviceGet;
  } catch (const Error&) {
    // an old driver: multicast stays unknown
  }
  auto attribute = [](cudaDeviceAttr attr, int device) {
    int v = -1;
    if (cudaDeviceGetAttribute(&v, attr, device) != cudaSuccess) {
      clearCudaError();
      return -1;
    }
    return v;
  };
  for (int d = 0; d < count; ++d) {
    GpuFacts g;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) == cudaSuccess) {
      g.name = prop.name;
    } else {
      clearCudaError();
      g.name = "?";
    }
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, d) == cudaSuccess) {
      g.busId = bus;
    } else {
      clearCudaError();
      g.busId = "?";
    }
    g.computeMode = attribute(cudaDevAttrComputeMode, d);
    g.gpuDirectRdma = attribute(cudaDevAttrGPUDirectRDMASupported, d);
    CUdevice dev = 0;
    int mc = 0;
    if (driverAttribute && driverDevice && driverDevice(&dev, d) == CUDA_SUCCESS &&
        driverAttribute(&mc, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, dev) == CUDA_SUCCESS) {
      g.multicast = mc;
    }
    f.gpus.push_back(std::move(g));
  }
  f.peer.assign(size_t(count), std::vector<int>(size_t(count), -1));
  for (int a = 0; a < count; ++a) {
    for (int b = 0; b < count; ++b) {
      int can = 0;
      if (a == b) continue;
      if (cudaDeviceCanAccessPeer(&can, a, b) == cudaSuccess) {
        f.peer[size_t(a)][size_t(b)] = can;
      } else {
        clearCudaError();
      }
    }
  }
  return f;
}

std::vector<backend::CheckLine> checkNode(const Config& /*config*/) {
  return checkLines(gatherFacts());
}

const backend::ModuleInfo kInfo = {
    STRATA_MODULE_ABI_VERSION,
    backend::ModuleKind::Transport,
    "nvlink",
    STRATA_VERSION_STRING,
    "CUDA IPC between GPUs of one host (NVLink or PCIe), copies on one CUDA stream per "
    "connection",
    nullptr,
    nullptr,
    &create,
    nullptr,
    &checkNode,
};

}  // namespace
}  // namespace strata::nvlink

extern "C" __attribute__((visibility("default"))) const strata::backend::ModuleInfo*
strata_module_info() {
  return &strata::nvlink::kInfo;
}
