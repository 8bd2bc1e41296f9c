#include "tuning.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <span>
#include <string_view>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/strings.hpp"
#include "base/wire.hpp"

namespace strata::collectives {

namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
/// Small, medium and large per-rank sizes: the rates change with the size (caches, page-table
/// walks), so one size would not do; 8 MiB keeps the probe under a few milliseconds.
constexpr uint64_t kProbeSizes[] = {64 * kKiB, kMiB, 4 * kMiB};
constexpr int kTimedReads = 3;

constexpr uint32_t kSamplesMagic = 0x55545453u;  // "STTU" little-endian
constexpr uint16_t kSamplesVersion = 1;
constexpr const char* kSamplesWhat = "host collectives tuning samples";

constexpr std::string_view kCacheHeader = "# strata host tuning cache, version 1";
constexpr size_t kMaxCacheEntries = 32;

std::string sizeText(uint64_t bytes) {
  if (bytes >= kMiB && bytes % kMiB == 0) return fmt::format("{} MiB", bytes / kMiB);
  if (bytes >= kKiB && bytes % kKiB == 0) return fmt::format("{} KiB", bytes / kKiB);
  return fmt::format("{} B", bytes);
}

// --- measuring ------------------------------------------------------------------------------

void vmRead(int pid, uint64_t address, char* dst, size_t bytes) {
  const uint64_t start = address;
  const size_t total = bytes;
  while (bytes > 0) {
    iovec local{dst, bytes};
    iovec remote{reinterpret_cast<void*>(address), bytes};
    ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;  // n == 0 sets no errno
      if (err == EINTR) continue;
      throw Error(
          ErrorCode::SystemError,
          fmt::format("probing the single-copy read rate: process_vm_readv of {} B at {:#x} "
                      "from pid {} failed after {} B: {} (collectives.single_copy=off "
                      "avoids single copy and this probe)",
                      total, start, pid, total - bytes,
                      n == 0 ? "nothing read" : std::strerror(err)));
    }
    dst += n;
    address += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

void mapRead(const char* mapped, char* dst, size_t bytes) {
  std::memcpy(dst, mapped, bytes);
  // The destination is never read: without this the compiler may drop the copy it times.
  asm volatile("" : : "r"(dst) : "memory");
}

template <typename F>
std::chrono::nanoseconds timed(F&& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::steady_clock::now() - t0;
}

double gbs(uint64_t bytes, std::chrono::nanoseconds best) {
  // B/ns is GB/s; a read below the clock's resolution still gives a finite rate.
  return static_cast<double>(bytes) / static_cast<double>(std::max<int64_t>(best.count(), 1));
}

// --- the cost model -------------------------------------------------------------------------

double ratioOf(const ProbeSample& s) {
  if (!(std::isfinite(s.mapGBs) && s.mapGBs > 0 && std::isfinite(s.vmGBs))) return 0;
  return s.vmGBs / s.mapGBs;
}

/// Ranks per core of the host (at least 1).
double oversubscription(int ranksPerHost, int cores) {
  if (ranksPerHost <= 0 || cores <= 0 || ranksPerHost <= cores) return 1.0;
  return static_cast<double>(ranksPerHost) / static_cast<double>(cores);
}

/// The smallest size from which single copy wins at that size and every larger candidate. The
/// candidates are the sample sizes and, when given, `boundary` (from where a call needs more
/// than one slot chunk per peer); the ratio at a candidate is that of the largest sample not
/// above it (the smallest sample's below all of them); the ratio needed is `need` below the
/// boundary and `needBeyond` from it on.
uint64_t thresholdFor(const std::vector<ProbeSample>& sorted, double need, double needBeyond = -1,
                      uint64_t boundary = UINT64_MAX) {
  if (needBeyond < 0) needBeyond = need;
  std::vector<uint64_t> candidates;
  for (const ProbeSample& s : sorted) candidates.push_back(s.bytes);
  if (boundary != UINT64_MAX && !sorted.empty()) candidates.push_back(boundary);
  std::sort(candidates.begin(), candidates.end());
  auto ratioAt = [&](uint64_t bytes) {
    double r = ratioOf(sorted.front());
    for (const ProbeSample& s : sorted) {
      if (s.bytes <= bytes) r = ratioOf(s);
    }
    return r;
  };
  uint64_t threshold = UINT64_MAX;
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    if (ratioAt(*it) < (*it >= boundary ? needBeyond : need)) break;
    threshold = *it;
  }
  return threshold;
}

std::string decisionText(std::string_view family, uint64_t threshold) {
  if (threshold == UINT64_MAX) return fmt::format("{}: the slots at every size", family);
  return fmt::format("{}: single copy from {} per rank, the slots below", family,
                     sizeText(threshold));
}

// --- the cache file -------------------------------------------------------------------------

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

int hexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

struct Entry {
  MachineKey key;
  std::vector<ProbeSample> samples;
};

/// What is wrong with samples, or an empty string: the rules an entry of the cache obeys.
std::string samplesProblem(const std::vector<ProbeSample>& samples) {
  if (samples.empty()) return "no samples";
  if (samples.size() > kMaxProbeSamples) {
    return fmt::format("{} samples, more than {}", samples.size(), kMaxProbeSamples);
  }
  for (size_t i = 0; i < samples.size(); ++i) {
    const ProbeSample& s = samples[i];
    if (s.bytes == 0) return fmt::format("sample {} has size 0", i + 1);
    if (i > 0 && s.bytes <= samples[i - 1].bytes) {
      return fmt::format("sample sizes not increasing ({} after {})", s.bytes,
                         samples[i - 1].bytes);
    }
    if (!(std::isfinite(s.vmGBs) && s.vmGBs > 0)) {
      return fmt::format("sample of {} B has a bad process_vm_readv rate {}", s.bytes, s.vmGBs);
    }
    if (!(std::isfinite(s.mapGBs) && s.mapGBs > 0)) {
      return fmt::format("sample of {} B has a bad memcpy rate {}", s.bytes, s.mapGBs);
    }
  }
  return {};
}

std::string entryLine(const Entry& e) {
  std::string samples;
  for (const ProbeSample& s : e.samples) {
    if (!samples.empty()) samples += ',';
    // "{}" is the shortest text that reads back to the same double.
    samples += fmt::format("{}:{}:{}", s.bytes, s.vmGBs, s.mapGBs);
  }
  return fmt::format("cpu={} kernel={} ranks={} cores={} samples={}", quote(e.key.cpuModel),
                     quote(e.key.kernel), e.key.ranksPerHost, e.key.cores, samples);
}

template <typename T>
bool parseNumber(std::string_view text, T& out) {
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

/// Parses one entry line; on failure returns nullopt and says why in *why.
std::optional<Entry> parseEntry(std::string_view line, std::string* why) {
  std::map<std::string, std::string, std::less<>> values;
  size_t pos = 0;
  while (pos < line.size()) {
    if (line[pos] == ' ') {
      ++pos;
      continue;
    }
    const size_t eq = line.find('=', pos);
    const size_t space = line.find(' ', pos);
    if (eq == std::string_view::npos || (space != std::string_view::npos && space < eq)) {
      *why = fmt::format("expected key=value at column {}", pos + 1);
      return std::nullopt;
    }
    std::string key(line.substr(pos, eq - pos));
    pos = eq + 1;
    std::string value;
    if (pos < line.size() && line[pos] == '"') {
      const size_t open = pos++;
      bool closed = false;
      while (pos < line.size()) {
        char c = line[pos++];
        if (c == '"') {
          closed = true;
          break;
        }
        if (c != '\\') {
          value += c;
          continue;
        }
        if (pos < line.size() && (line[pos] == '"' || line[pos] == '\\')) {
          value += line[pos++];
        } else if (pos + 2 < line.size() && line[pos] == 'x' && hexDigit(line[pos + 1]) >= 0 &&
                   hexDigit(line[pos + 2]) >= 0) {
          value += static_cast<char>(hexDigit(line[pos + 1]) * 16 + hexDigit(line[pos + 2]));
          pos += 3;
        } else {
          *why = fmt::format("bad escape in the value of '{}' at column {}", key, pos);
          return std::nullopt;
        }
      }
      if (!closed) {
        *why = fmt::format("unterminated quoted value of '{}' from column {}", key, open + 1);
        return std::nullopt;
      }
      if (pos < line.size() && line[pos] != ' ') {
        *why = fmt::format("no space after the quoted value of '{}' (column {})", key, pos + 1);
        return std::nullopt;
      }
    } else {
      const size_t end = std::min(line.find(' ', pos), line.size());
      value = std::string(line.substr(pos, end - pos));
      pos = end;
    }
    if (!values.emplace(key, std::move(value)).second) {
      *why = fmt::format("key '{}' given twice", key);
      return std::nullopt;
    }
  }
  for (const auto& [key, value] : values) {
    if (key != "cpu" && key != "kernel" && key != "ranks" && key != "cores" && key != "samples") {
      *why = fmt::format("unknown key '{}'", key);
      return std::nullopt;
    }
  }
  for (const char* key : {"cpu", "kernel", "ranks", "cores", "samples"}) {
    if (!values.count(key)) {
      *why = fmt::format("no '{}'", key);
      return std::nullopt;
    }
  }
  Entry e;
  e.key.cpuModel = values["cpu"];
  e.key.kernel = values["kernel"];
  if (!parseNumber(values["ranks"], e.key.ranksPerHost) || e.key.ranksPerHost < 0) {
    *why = fmt::format("ranks={} is not a count", values["ranks"]);
    return std::nullopt;
  }
  if (!parseNumber(values["cores"], e.key.cores) || e.key.cores < 0) {
    *why = fmt::format("cores={} is not a count", values["cores"]);
    return std::nullopt;
  }
  const std::string& samplesText = values["samples"];
  if (!samplesText.empty()) {
    for (std::string_view item : strings::split(samplesText, ',')) {
      auto fields = strings::split(item, ':');
      ProbeSample s;
      if (fields.size() != 3 || !parseNumber(fields[0], s.bytes) ||
          !parseNumber(fields[1], s.vmGBs) || !parseNumber(fields[2], s.mapGBs)) {
        *why = fmt::format("sample '{}' is not bytes:vm:map", item);
        return std::nullopt;
      }
      e.samples.push_back(s);
      if (e.samples.size() > kMaxProbeSamples) break;  // samplesProblem names it
    }
  }
  if (std::string bad = samplesProblem(e.samples); !bad.empty()) {
    *why = std::move(bad);
    return std::nullopt;
  }
  return e;
}

/// Reads a whole file; returns 0 or the errno of what failed.
int readFile(const std::filesystem::path& file, std::string& content) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  char buf[8192];
  int err = 0;
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    if (n <= 0) break;
    content.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return err;
}

struct ParsedCache {
  bool exists = false;
  std::vector<Entry> entries;  ///< the valid ones, in file order (oldest first)
  std::string problem;         ///< the first problem, "file:line: what", or empty
};

ParsedCache parseCache(const std::filesystem::path& file) {
  ParsedCache out;
  std::string content;
  if (int err = readFile(file, content); err != 0) {
    if (err != ENOENT) {
      out.exists = true;
      out.problem = fmt::format("{}: cannot read it: {}", file.string(), std::strerror(err));
    }
    return out;
  }
  out.exists = true;
  auto lines = strings::split(content, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();  // the final newline
  if (lines.empty() || lines[0] != kCacheHeader) {
    out.problem = fmt::format(
        "{}:1: not a strata host tuning cache of version 1 (the first line "
        "is not \"{}\")",
        file.string(), kCacheHeader);
    return out;
  }
  size_t bad = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::string_view line = lines[i];
    if (line.empty() || line[0] == '#') continue;
    std::string why;
    if (auto e = parseEntry(line, &why)) {
      out.entries.push_back(std::move(*e));
    } else if (bad++ == 0) {
      out.problem = fmt::format("{}:{}: {}", file.string(), i + 1, why);
    }
  }
  if (bad > 1) out.problem += fmt::format(" (and {} more bad lines)", bad - 1);
  return out;
}

}  // namespace

// --- MachineKey -------------------------------------------------------------------------------

MachineKey MachineKey::current(int ranksPerHost) {
  MachineKey key;
  key.ranksPerHost = ranksPerHost;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    if (auto colon = line.find(':'); colon != std::string::npos) {
      key.cpuModel = std::string(strings::trim(std::string_view(line).substr(colon + 1)));
    }
    break;
  }
  if (key.cpuModel.empty()) key.cpuModel = "unknown";
  utsname u{};
  key.kernel = ::uname(&u) == 0 ? u.release : "unknown";
  // The mask may be larger than cpu_set_t on very large machines: grow until it fits.
  for (int cpus = 1024; cpus <= (1 << 20) && key.cores == 0; cpus *= 2) {
    cpu_set_t* set = CPU_ALLOC(cpus);
    if (set == nullptr) break;
    const size_t size = CPU_ALLOC_SIZE(cpus);
    const bool ok = ::sched_getaffinity(0, size, set) == 0;
    const int err = errno;
    if (ok) key.cores = CPU_COUNT_S(size, set);
    CPU_FREE(set);
    if (!ok && err != EINVAL) break;
  }
  if (key.cores == 0)
    key.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return key;
}

std::string MachineKey::text() const {
  return fmt::format("cpu {}, kernel {}, {} ranks per host, {} cores", quote(cpuModel), kernel,
                     ranksPerHost, cores);
}

// --- measuring ------------------------------------------------------------------------------

std::vector<ProbeSample> probeReads(int peerPid, uint64_t peerAddress, const char* mapped,
                                    size_t maxBytes) {
  std::vector<ProbeSample> samples;
  uint64_t largest = 0;
  for (uint64_t bytes : kProbeSizes) {
    if (bytes <= maxBytes) largest = bytes;
  }
  if (largest == 0) return samples;
  if (mapped == nullptr) {
    throw Error(ErrorCode::InvalidArgument,
                "probing the single-copy read rate: no mapped view of the peer's pages");
  }
  // Zero-filled, so its pages are faulted in before anything is timed; both ways write into it.
  std::vector<char> buffer(largest);
  for (uint64_t bytes : kProbeSizes) {
    if (bytes > maxBytes) break;
    // The warm-up faults in the page tables and brings the source into the state every timed
    // read then finds.
    vmRead(peerPid, peerAddress, buffer.data(), bytes);
    mapRead(mapped, buffer.data(), bytes);
    auto bestVm = std::chrono::nanoseconds::max();
    auto bestMap = std::chrono::nanoseconds::max();
    for (int i = 0; i < kTimedReads; ++i) {
      bestVm = std::min(bestVm, timed([&] { vmRead(peerPid, peerAddress, buffer.data(), bytes); }));
      bestMap = std::min(bestMap, timed([&] { mapRead(mapped, buffer.data(), bytes); }));
    }
    samples.push_back({bytes, gbs(bytes, bestVm), gbs(bytes, bestMap)});
  }
  return samples;
}

// --- the cost model -------------------------------------------------------------------------

Choices deriveChoices(const std::vector<ProbeSample>& samples, int ranksPerHost, int cores,
                      uint64_t chunkBytes) {
  Choices c;
  const std::string machine = fmt::format("{} ranks per host, {} cores", ranksPerHost, cores);
  if (samples.empty()) {
    c.why.push_back(fmt::format(
        "no measurement of process_vm_readv against memcpy ({}): the slots at every size for "
        "every collective",
        machine));
    return c;
  }
  std::vector<ProbeSample> sorted = samples;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const ProbeSample& a, const ProbeSample& b) { return a.bytes < b.bytes; });
  std::string figures;
  for (const ProbeSample& s : sorted) {
    if (!figures.empty()) figures += ", ";
    figures += fmt::format("{:.2f} at {} ({:.3g}/{:.3g} GB/s)", ratioOf(s), sizeText(s.bytes),
                           s.vmGBs, s.mapGBs);
  }
  // With more ranks than cores, a call that needs more than one slot chunk per peer waits for
  // credits that a peer returns only once the scheduler runs it (a single copy needs only the
  // reader scheduled): from there the slots' cost grows with the square of ranks per core.
  const double share = oversubscription(ranksPerHost, cores);
  const bool handOffs = share > 1 && chunkBytes > 0;
  const double gatherNeed = kGatherRatio;
  const double allReduceNeed = kAllReduceRatio;
  const double beyond = handOffs ? share * share : 1.0;
  // allGather sends each peer its whole block. Not allReduce: its two-shot sends 1/N of the
  // message to each peer in pieces, and measured it beat single copy at every size with 4
  // ranks on 2 cores.
  const uint64_t gatherBoundary = handOffs ? chunkBytes : UINT64_MAX;
  const uint64_t allReduceBoundary = UINT64_MAX;
  c.gatherSingleCopyMin = thresholdFor(sorted, gatherNeed, gatherNeed / beyond, gatherBoundary);
  c.allReduceSingleCopyMin =
      thresholdFor(sorted, allReduceNeed, allReduceNeed / beyond, allReduceBoundary);
  auto rule = [&](double need, uint64_t boundary) {
    std::string text = fmt::format("{:.3g}", need);
    if (boundary != UINT64_MAX) {
      text += fmt::format(
          ", {:.3g} (/ {:.3g}^2 ranks per core) from {} per rank (more than one "
          "slot chunk per peer)",
          need / beyond, share, sizeText(boundary));
    }
    return text;
  };
  c.why.push_back(fmt::format(
      "{}: process_vm_readv/memcpy = {}; single copy (one kernel copy) beats the slots (two user "
      "copies) where the ratio is >= {} at that size and every larger one ({})",
      decisionText("allGather, reduceScatter, broadcast, allToAll", c.gatherSingleCopyMin), figures,
      rule(gatherNeed, gatherBoundary), machine));
  c.why.push_back(fmt::format(
      "{}: process_vm_readv/memcpy = {}; its single copy reads twice, adds a staging pass and a "
      "message round, so it needs the ratio >= {} at that size and every larger one ({})",
      decisionText("allReduce", c.allReduceSingleCopyMin), figures,
      rule(allReduceNeed, allReduceBoundary), machine));
  return c;
}

// --- the cache --------------------------------------------------------------------------------

std::optional<std::filesystem::path> tuningCacheFile() {
  // The XDG base directory specification: a relative XDG_CACHE_HOME is invalid and ignored.
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') {
    return std::filesystem::path(xdg) / "strata" / "host-tuning.txt";
  }
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') {
    return std::filesystem::path(home) / ".cache" / "strata" / "host-tuning.txt";
  }
  return std::nullopt;
}

std::optional<std::vector<ProbeSample>> loadCachedSamples(const std::filesystem::path& file,
                                                          const MachineKey& key,
                                                          std::string* problem) {
  if (problem != nullptr) problem->clear();
  ParsedCache cache = parseCache(file);
  if (!cache.problem.empty()) {
    if (problem != nullptr) *problem = std::move(cache.problem);
    return std::nullopt;
  }
  // The newest entry wins (store never writes two for one key, a hand edit might).
  for (auto it = cache.entries.rbegin(); it != cache.entries.rend(); ++it) {
    if (it->key == key) return std::move(it->samples);
  }
  return std::nullopt;
}

std::string storeCachedSamples(const std::filesystem::path& file, const MachineKey& key,
                               const std::vector<ProbeSample>& samples) {
  if (std::string bad = samplesProblem(samples); !bad.empty()) {
    return fmt::format("not caching the measurement in {}: {}", file.string(), bad);
  }
  const std::filesystem::path folder = file.parent_path();
  if (!folder.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(folder, ec);
    if (ec) return fmt::format("cannot create {}: {}", folder.string(), ec.message());
  }
  // Bad lines of the old file are dropped: the rewrite repairs it.
  ParsedCache cache = parseCache(file);
  std::erase_if(cache.entries, [&](const Entry& e) { return e.key == key; });
  cache.entries.push_back({key, samples});
  if (cache.entries.size() > kMaxCacheEntries) {
    cache.entries.erase(cache.entries.begin(),
                        cache.entries.end() - static_cast<ptrdiff_t>(kMaxCacheEntries));
  }
  std::string content(kCacheHeader);
  content += '\n';
  for (const Entry& e : cache.entries) {
    content += entryLine(e);
    content += '\n';
  }

  std::string tmp = file.string() + ".tmp.XXXXXX";
  int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) {
    return fmt::format("cannot create a temporary file next to {}: {}", file.string(),
                       std::strerror(errno));
  }
  std::string failed;
  for (size_t done = 0; done < content.size();) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      failed =
          fmt::format("cannot write {}: {}", tmp, n < 0 ? std::strerror(errno) : "no progress");
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 && failed.empty()) {
    failed = fmt::format("cannot write {}: {}", tmp, std::strerror(errno));
  }
  if (failed.empty() && ::rename(tmp.c_str(), file.c_str()) != 0) {
    failed = fmt::format("cannot rename {} to {}: {}", tmp, file.string(), std::strerror(errno));
  }
  if (!failed.empty()) ::unlink(tmp.c_str());
  return failed;
}

// --- the encoding -----------------------------------------------------------------------------

std::vector<uint8_t> encodeSamples(const std::vector<ProbeSample>& samples) {
  if (samples.size() > kMaxProbeSamples) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{}: {} samples, at most {} can be sent", kSamplesWhat, samples.size(),
                            kMaxProbeSamples));
  }
  wire::Writer w;
  w.u32(kSamplesMagic).u16(kSamplesVersion).u16(static_cast<uint16_t>(samples.size()));
  for (const ProbeSample& s : samples) w.u64(s.bytes).f64(s.vmGBs).f64(s.mapGBs);
  return w.take();
}

std::vector<ProbeSample> decodeSamples(const uint8_t* data, size_t size) {
  wire::Reader r(std::span<const uint8_t>(data, size), kSamplesWhat);
  const uint32_t magic = r.u32("magic");
  if (magic != kSamplesMagic) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("{}: bad magic {:#010x}, expected {:#010x} (\"STTU\")", kSamplesWhat,
                            magic, kSamplesMagic));
  }
  const uint16_t version = r.u16("version");
  if (version != kSamplesVersion) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("{}: unknown version {} (this build reads version {}): are all ranks "
                            "running the same strata?",
                            kSamplesWhat, version, kSamplesVersion));
  }
  const uint16_t count = r.u16("count");
  if (count > kMaxProbeSamples) {
    throw Error(ErrorCode::ProtocolError, fmt::format("{}: count {} is over the limit of {}",
                                                      kSamplesWhat, count, kMaxProbeSamples));
  }
  std::vector<ProbeSample> samples(count);
  for (uint16_t i = 0; i < count; ++i) {
    ProbeSample& s = samples[i];
    s.bytes = r.u64("bytes");
    s.vmGBs = r.f64("vm rate");
    s.mapGBs = r.f64("map rate");
    for (auto [rate, name] :
         {std::pair{s.vmGBs, "process_vm_readv"}, std::pair{s.mapGBs, "memcpy"}}) {
      if (!std::isfinite(rate) || rate < 0) {
        throw Error(ErrorCode::ProtocolError,
                    fmt::format("{}: sample {} has the {} rate {}, not a finite non-negative "
                                "number",
                                kSamplesWhat, i + 1, name, rate));
      }
    }
  }
  r.expectEnd();
  return samples;
}

}  // namespace strata::collectives
