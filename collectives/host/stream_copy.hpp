#pragma once

// Copies that bypass the cache for their destination (non-temporal stores), for calls whose
// buffers do not fit the cache: a plain store first reads the destination line (a third memory
// transfer per byte copied) and evicts what the next steps need. glibc's memcpy switches to such
// stores itself only above a threshold it derives from the cache size that CPUID reports, which
// virtual machines misreport (one AMD EPYC guest: 320 MiB of "shared cache", so never, where the
// kernel's cache table says 32 MiB); there a 64 MiB copy ran at 10.6 GB/s with memcpy and
// 20.9 GB/s streamed, per thread with two threads copying, while a 4 MiB copy that fits the cache
// ran at 48 GB/s with memcpy and 15-28 streamed. So the host collectives stream a call's copies
// into its destination when the call's buffers exceed this rank's share of the last-level
// cache, as the kernel's cache table (sysfs) gives it (docs/collectives.md, "Streaming copies").

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace strata::collectives {

/// dst = src for bytes (the ranges must not overlap), with non-temporal stores on x86-64
/// (SSE2, always present there; head and tail by memcpy) followed by a store fence; memcpy on
/// other CPUs.
void streamCopy(void* dst, const void* src, size_t bytes);

/// dst = src unless they are the same buffer: streamCopy when stream, else memmove.
void copyOut(bool stream, void* dst, const void* src, size_t bytes);

/// The largest cache level of the machine, from sysfs.
struct CacheInfo {
  int level = 0;       ///< 0: unknown
  uint64_t bytes = 0;  ///< size of one instance
  int instances = 0;   ///< distinct instances (by their shared_cpu_list)
  uint64_t total() const { return bytes * static_cast<uint64_t>(instances); }
};

/// A sysfs cache size ("32768K", "2M", "512"): bytes, or 0 when it does not parse.
uint64_t parseCacheSize(std::string_view text);

/// Reads cpuN/cache/indexM/{level,size,shared_cpu_list} under cpuRoot (normally
/// /sys/devices/system/cpu) and returns the highest level's size and how many distinct
/// instances the CPUs have. Unknown (level 0) when nothing there parses.
CacheInfo lastLevelCache(const std::filesystem::path& cpuRoot = "/sys/devices/system/cpu");

/// Bytes of a call's buffers on one rank (send plus receive) from which its copies into the
/// destination stream: the rank's share of the last-level cache (total / ranks on the host);
/// UINT64_MAX when the cache is unknown. *why (if non-null) says why, with the figures.
uint64_t streamMinBytes(const CacheInfo& cache, int ranksOnHost, std::string* why = nullptr);

}  // namespace strata::collectives
