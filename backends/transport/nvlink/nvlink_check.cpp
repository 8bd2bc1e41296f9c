#include "nvlink_check.hpp"

#include <fmt/format.h>

namespace strata::nvlink {

namespace {

using State = backend::CheckLine::State;

std::string modeName(int mode) {
  switch (mode) {
    case 0:
      return "default";
    case 1:
      return "exclusive thread";
    case 2:
      return "prohibited";
    case 3:
      return "exclusive process";
    default:
      return fmt::format("mode {}", mode);
  }
}

/// "0, 1, 3" for the GPUs whose field equals `value`.
template <typename Field>
std::string gpusWhere(const std::vector<GpuFacts>& gpus, Field field, int value) {
  std::string out;
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (gpus[i].*field == value) out += (out.empty() ? "" : ", ") + std::to_string(i);
  }
  return out;
}

}  // namespace

std::vector<backend::CheckLine> checkLines(const NodeFacts& f) {
  std::vector<backend::CheckLine> out;
  if (!f.driver) {
    out.push_back(
        {"CUDA", State::Ok, "no CUDA driver here (/dev/nvidiactl absent): host memory only", ""});
    return out;
  }
  if (!f.error.empty() || f.gpus.empty()) {
    out.push_back(
        {"CUDA", State::Warn,
         !f.error.empty()
             ? "cudaGetDeviceCount failed: " + f.error
             : fmt::format("the driver shows no device{}",
                           f.visible.empty() ? "" : " (CUDA_VISIBLE_DEVICES=" + f.visible + ")"),
         "no GPU transport: CUDA buffers are refused, host memory works"});
    return out;
  }
  for (size_t i = 0; i < f.gpus.size(); ++i) {
    const GpuFacts& g = f.gpus[i];
    backend::CheckLine l{
        fmt::format("GPU {}", i), State::Ok,
        fmt::format("{} at {}, compute mode {}", g.name, g.busId, modeName(g.computeMode)), ""};
    if (g.computeMode == 2) {
      l.state = State::Warn;
      l.fallback = "no process can create a context on it: a rank given this GPU fails at create";
    } else if (g.computeMode == 1 || g.computeMode == 3) {
      l.fallback = "one process per GPU (the CUDA collectives refuse two ranks on one GPU anyway)";
    }
    out.push_back(std::move(l));
  }
  // Peer access between every pair (in both directions).
  if (f.gpus.size() > 1) {
    std::string missing, unknown;
    for (size_t a = 0; a < f.gpus.size(); ++a) {
      for (size_t b = 0; b < f.gpus.size(); ++b) {
        if (a == b) continue;
        const int v = a < f.peer.size() && b < f.peer[a].size() ? f.peer[a][b] : -1;
        std::string& list = v == 0 ? missing : unknown;
        if (v != 1) list += fmt::format("{}{} -> {}", list.empty() ? "" : ", ", a, b);
      }
    }
    if (!missing.empty()) {
      out.push_back({"GPU peer access", State::Warn, "none from GPU " + missing,
                     "a kernel on one cannot reach the other's memory, and CUDA IPC maps a buffer "
                     "only where cudaDeviceCanAccessPeer allows it: the nvlink import between "
                     "ranks on such a pair fails, naming the owner rank; strata has no "
                     "host-staged path for device buffers yet. Give those ranks GPUs that are "
                     "peers, or keep their buffers in host memory"});
    }
    if (!unknown.empty()) {
      out.push_back(
          {"GPU peer access", State::Unknown, "cudaDeviceCanAccessPeer failed for " + unknown, ""});
    }
    if (missing.empty() && unknown.empty()) {
      out.push_back({"GPU peer access", State::Ok,
                     fmt::format("every pair of the {} GPUs (NVLink or PCIe P2P)", f.gpus.size()),
                     ""});
    }
  }
  // GPUDirect RDMA: whether a NIC may read and write this GPU's memory at all.
  const std::string noGdr = gpusWhere(f.gpus, &GpuFacts::gpuDirectRdma, 0);
  const std::string unknownGdr = gpusWhere(f.gpus, &GpuFacts::gpuDirectRdma, -1);
  if (!noGdr.empty()) {
    out.push_back({"GPUDirect RDMA", State::Warn, "not supported on GPU " + noGdr,
                   "CUDA buffers cross hosts through pinned host bounce buffers (as today on "
                   "every GPU: the direct path is not written yet)"});
  } else if (!unknownGdr.empty()) {
    out.push_back(
        {"GPUDirect RDMA", State::Unknown, "the driver did not say for GPU " + unknownGdr, ""});
  } else {
    out.push_back({"GPUDirect RDMA", State::Ok, "supported by every GPU (the NIC side: FI_HMEM)",
                   "strata's cross-host step still copies through host bounce buffers"});
  }
  // NVLink multicast (NVLS): an NVSwitch system with a driver and fabric manager that allow it.
  const std::string mc = gpusWhere(f.gpus, &GpuFacts::multicast, 1);
  out.push_back({"NVLink multicast (NVLS)", State::Ok,
                 mc.empty() ? "not supported (no NVSwitch multicast, or the driver lacks it)"
                            : "supported on GPU " + mc,
                 "strata has no NVLS algorithm yet: the CUDA collectives use their direct and "
                 "packet kernels"});
  return out;
}

}  // namespace strata::nvlink
