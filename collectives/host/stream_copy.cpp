#include "stream_copy.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <system_error>

#include <fmt/format.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace strata::collectives {

void streamCopy(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  // Plain copy up to a 16-byte aligned destination (the streaming store needs it).
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (bytes < head + 64) {
    std::memcpy(d, s, bytes);
    return;
  }
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  // Streaming stores are weakly ordered: fence before anything (a flag, a peer's read of this
  // buffer) can publish them.
  _mm_sfence();
  std::memcpy(d + i, s + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

void copyOut(bool stream, void* dst, const void* src, size_t bytes) {
  if (dst == src || bytes == 0) return;
  if (stream) {
    streamCopy(dst, src, bytes);
  } else {
    std::memmove(dst, src, bytes);
  }
}

uint64_t parseCacheSize(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) return 0;
  std::string_view unit(end, static_cast<size_t>(text.data() + text.size() - end));
  uint64_t scale = 1;
  if (unit == "K") {
    scale = uint64_t{1} << 10;
  } else if (unit == "M") {
    scale = uint64_t{1} << 20;
  } else if (unit == "G") {
    scale = uint64_t{1} << 30;
  } else if (!unit.empty()) {
    return 0;
  }
  if (value > std::numeric_limits<uint64_t>::max() / scale) return 0;
  return value * scale;
}

namespace {

std::string firstLine(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

CacheInfo lastLevelCache(const std::filesystem::path& cpuRoot) {
  CacheInfo best;
  std::set<std::string> instances;
  std::error_code ec;
  for (const auto& cpu : std::filesystem::directory_iterator(cpuRoot, ec)) {
    const std::string name = cpu.path().filename().string();
    if (name.size() < 4 || name.compare(0, 3, "cpu") != 0 ||
        name.find_first_not_of("0123456789", 3) != std::string::npos) {
      continue;
    }
    std::error_code ec2;
    for (const auto& index : std::filesystem::directory_iterator(cpu.path() / "cache", ec2)) {
      if (index.path().filename().string().compare(0, 5, "index") != 0) continue;
      // Instruction caches never hold data the copies touch.
      if (firstLine(index.path() / "type") == "Instruction") continue;
      int level = 0;
      const std::string lv = firstLine(index.path() / "level");
      std::from_chars(lv.data(), lv.data() + lv.size(), level);
      const uint64_t bytes = parseCacheSize(firstLine(index.path() / "size"));
      if (level <= 0 || bytes == 0 || level < best.level) continue;
      if (level > best.level) {
        best = CacheInfo{level, bytes, 0};
        instances.clear();
      }
      best.bytes = std::max(best.bytes, bytes);
      std::string shared = firstLine(index.path() / "shared_cpu_list");
      instances.insert(shared.empty() ? name : shared);
    }
  }
  best.instances = static_cast<int>(instances.size());
  if (best.instances == 0) best = CacheInfo{};
  return best;
}

uint64_t streamMinBytes(const CacheInfo& cache, int ranksOnHost, std::string* why) {
  if (cache.level == 0 || cache.total() == 0) {
    if (why) *why = "streaming copies: never (the last-level cache size is unknown)";
    return UINT64_MAX;
  }
  const uint64_t ranks = static_cast<uint64_t>(std::max(ranksOnHost, 1));
  const uint64_t min = cache.total() / ranks;
  if (why) {
    *why = fmt::format(
        "streaming copies: into the destination of calls whose send plus receive buffers reach "
        "{} B per rank: the L{} cache, {} x {} B, shared by {} rank(s) on this host",
        min, cache.level, cache.instances, cache.bytes, ranks);
  }
  return min;
}

}  // namespace strata::collectives
