#pragma once

// Where the host collectives switch from slots to single copy, measured on the machine.
//
// Two ways move a rank's data to a same-host peer: the slots (the sender copies into a shared
// mapping, the receiver copies out: two user-space copies per byte) and single copy (the reader
// pulls the peer's buffer with one process_vm_readv kernel copy). Which is faster depends on the
// machine, not on the architecture: on one AMD EPYC process_vm_readv read 6.8 GB/s and a memcpy
// from a shared mapping 11.6 GB/s (ratio 0.59: single copy wins), on another 13.5 against 48 GB/s
// (ratio 0.28: slots win by far). A fixed crossover is therefore wrong somewhere; creation
// measures both rates instead (probeReads), derives the crossovers with a small cost model
// (deriveChoices) and caches the measurement per machine (loadCachedSamples,
// storeCachedSamples), so that only the first job on a machine pays for the probe. Rank 0
// measures or loads, and broadcasts its samples (encodeSamples, decodeSamples) so that every rank
// picks the same algorithms.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace strata::collectives {

/// One probe size: how fast this process read a same-host peer's pages, two ways.
struct ProbeSample {
  uint64_t bytes = 0;
  double vmGBs = 0;   ///< process_vm_readv from the peer (best of the repetitions), GB/s = 1e9 B/s
  double mapGBs = 0;  ///< memcpy from the same pages mapped into this process
};

/// The most samples a measurement has (cache entries and the encoding reject more).
inline constexpr size_t kMaxProbeSamples = 8;

/// What the measurements depend on; a cached measurement is used only for an equal key.
struct MachineKey {
  std::string cpuModel;  ///< first "model name" of /proc/cpuinfo, else "unknown"
  std::string kernel;    ///< uname(2) release
  int ranksPerHost = 0;
  int cores = 0;  ///< CPUs this process may run on (sched_getaffinity); the engine replaces it
                  ///< with the union of its host's ranks' affinities
  /// This process's machine, for a job of ranksPerHost ranks on this host.
  static MachineKey current(int ranksPerHost);
  /// One line: cpu "...", kernel ..., N ranks per host, C cores.
  std::string text() const;
  bool operator==(const MachineKey&) const = default;
};

/// Measures: for each size in {64 KiB, 1 MiB, 4 MiB} not above maxBytes, one warm-up then the
/// best of 3 timed reads of `bytes` each way: process_vm_readv(peerPid, [peerAddress, +bytes))
/// into a private buffer, and memcpy from `mapped` (the same pages mapped here) into the same
/// private buffer. Both ways thus read the same physical pages into the same destination, and
/// differ only in the copy. A failing process_vm_readv throws strata::Error(SystemError) naming
/// the pid and errno text. Uses std::chrono::steady_clock. Returns the samples in size order
/// (none when maxBytes < 64 KiB).
std::vector<ProbeSample> probeReads(int peerPid, uint64_t peerAddress, const char* mapped,
                                    size_t maxBytes);

/// The host algorithms' crossovers.
struct Choices {
  /// Bytes per rank from which allReduce reads by single copy; UINT64_MAX: never.
  uint64_t allReduceSingleCopyMin = UINT64_MAX;
  /// Same for allGather, reduceScatter, broadcast, allToAll.
  uint64_t gatherSingleCopyMin = UINT64_MAX;
  /// One line per decision, quoting the figures and the rule (for the info log and the listing).
  std::vector<std::string> why;
};

/// Single copy beats the slots for allGather, reduceScatter, broadcast and allToAll where
/// process_vm_readv reads at least this fraction of the mapped memcpy rate (see deriveChoices).
inline constexpr double kGatherRatio = 0.5;
/// The same for allReduce, whose single copy does more than read (see deriveChoices).
inline constexpr double kAllReduceRatio = 0.55;

/// The cost model. The slots move each byte with two user copies through shared memory (the
/// sender copies in, the receiver copies out), at about the mapped memcpy rate each; single copy
/// moves it with one kernel copy at the process_vm_readv rate. So single copy is cheaper at size
/// s when vm(s) / map(s) >= 0.5 (kGatherRatio). allReduce's single copy reads twice and adds a
/// pass over a staging buffer and one more message round, so it needs vm / map >= 0.55
/// (kAllReduceRatio). The threshold of each family is the smallest sample size s such that the
/// ratio holds at s and at every larger sample (a dip at a large size means the slots win there,
/// and a threshold is one switch point, not a set of ranges); none: UINT64_MAX. The rates depend
/// on the size (caches, page-table walks), so nothing is extrapolated below the smallest sample:
/// if the rule holds from the smallest sample, the threshold is that sample's size. Empty
/// samples: both UINT64_MAX, with a why line saying there was no measurement. The samples may
/// come in any order; a sample whose map rate is not positive and finite counts as failing the
/// rule. With more ranks per host than cores (share = ranksPerHost / cores > 1), the gather
/// family's ratio is divided by share^2 from chunkBytes per rank (0: unknown), where a call
/// needs more than one slot chunk per peer: every further chunk waits for a credit that the peer
/// returns only when the scheduler runs it, while a single copy needs only the reader
/// scheduled. Measured with 4 ranks on 2 cores (ratios 0.24-0.31, 512 KiB chunks): allGather's
/// single copy beat the slots at 4-16 MiB per rank and lost 2x at 256 KiB. allReduce keeps its
/// ratio: its two-shot sends each peer 1/N of the message in pieces and beat single copy at
/// every size there.
Choices deriveChoices(const std::vector<ProbeSample>& samples, int ranksPerHost, int cores,
                      uint64_t chunkBytes = 0);

/// The cache file: $XDG_CACHE_HOME/strata/host-tuning.txt (XDG_CACHE_HOME set to an absolute
/// path), else $HOME/.cache/strata/host-tuning.txt, else nullopt (no HOME).
std::optional<std::filesystem::path> tuningCacheFile();

/// The cached samples for key, or nullopt (no file, no entry for that key). A file that does
/// not parse, or an entry with bad values (no samples, more than 8, non-positive or non-finite
/// rates, sizes not increasing), is ignored as a whole: *problem (if non-null) says what and
/// where (file:line), so the caller can log it and re-probe; the next store rewrites the file
/// without the bad lines. *problem is empty when there is none.
///
/// The file is text: the line "# strata host tuning cache, version 1", then one line per
/// entry, oldest first:
///   cpu="AMD EPYC" kernel="6.1.0-28-amd64" ranks=2 cores=2 samples=65536:12.3:44.1,...
/// Strings are quoted with \" \\ and \xHH escapes (a cpu model may hold spaces and quotes, and
/// an entry stays one line); rates are written in the shortest form that reads back exactly, so
/// a loaded measurement decides exactly as the probed one did.
std::optional<std::vector<ProbeSample>> loadCachedSamples(const std::filesystem::path& file,
                                                          const MachineKey& key,
                                                          std::string* problem);

/// Stores (replaces) the entry for key, keeping other keys' valid entries (at most 32 entries:
/// the oldest are dropped), by writing a temporary file in the same folder and renaming it over
/// the file, so that concurrent jobs never see half a file (the last writer wins: a cache may
/// lose an entry, never be torn); creates the folder. Returns an empty string on success, else
/// what failed (the caller logs it: a cache that cannot be written is not an error). Samples
/// that loadCachedSamples would reject (none, more than 8, bad values) are not stored.
std::string storeCachedSamples(const std::filesystem::path& file, const MachineKey& key,
                               const std::vector<ProbeSample>& samples);

/// For broadcasting rank 0's samples to the other ranks through the bootstrap: an explicit
/// little-endian encoding (u32 magic "STTU", u16 version 1, u16 count <= 8, then per sample u64
/// bytes, f64 vm, f64 map). More than 8 samples throw Error(InvalidArgument).
std::vector<uint8_t> encodeSamples(const std::vector<ProbeSample>& samples);

/// Rejects bad magic, unknown version, count > 8, truncated or trailing input, non-finite or
/// negative rates with strata::Error(ProtocolError, message saying which).
std::vector<ProbeSample> decodeSamples(const uint8_t* data, size_t size);

}  // namespace strata::collectives
