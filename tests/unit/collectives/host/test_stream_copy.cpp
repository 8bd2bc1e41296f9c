// Streaming copies (collectives/host/stream_copy.hpp): the copy itself at every alignment and
// length around its 16-byte head and 64-byte body, the sysfs cache table parser on fake trees
// (one shared L3, per-CCX L3s, no cache table), and the threshold rule.
#define BOOST_TEST_MODULE stream_copy
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "collectives/host/stream_copy.hpp"

using strata::collectives::CacheInfo;
using strata::collectives::copyOut;
using strata::collectives::lastLevelCache;
using strata::collectives::parseCacheSize;
using strata::collectives::streamCopy;
using strata::collectives::streamMinBytes;

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string templ = (fs::temp_directory_path() / "strata-stream-XXXXXX").string();
    BOOST_REQUIRE(mkdtemp(templ.data()) != nullptr);
    path = templ;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void write(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text << '\n';
}

// cpuN/cache/indexM with the given level, type, size and shared_cpu_list.
void addCache(const fs::path& root, int cpu, int index, int level, const std::string& type,
              const std::string& size, const std::string& shared) {
  const fs::path dir =
      root / ("cpu" + std::to_string(cpu)) / "cache" / ("index" + std::to_string(index));
  write(dir / "level", std::to_string(level));
  write(dir / "type", type);
  write(dir / "size", size);
  write(dir / "shared_cpu_list", shared);
}

}  // namespace

BOOST_AUTO_TEST_CASE(copies_every_alignment_and_length) {
  // Source and destination offsets 0..17 and lengths around the head (16), the 64-byte body
  // and its tail; guard bytes around the destination must stay untouched.
  std::vector<unsigned char> src(4096 + 64), dst(4096 + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
  for (size_t so : {0, 1, 7, 15, 16, 17}) {
    for (size_t doff : {0, 1, 8, 15, 16, 17}) {
      for (size_t len : {0, 1, 15, 16, 63, 64, 65, 79, 80, 127, 128, 129, 1000, 4000}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        streamCopy(dst.data() + doff, src.data() + so, len);
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= doff && i < doff + len;
          const unsigned char want = inside ? src[so + i - doff] : 0xEE;
          if (dst[i] != want) {
            BOOST_FAIL("source offset " << so << ", destination offset " << doff << ", length "
                                        << len << ": byte " << i << " is " << int(dst[i])
                                        << ", expected " << int(want));
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(copy_out_streams_or_not_and_skips_in_place) {
  std::vector<char> a(1 << 20), b(1 << 20, 0);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<char>(i * 31);
  copyOut(true, b.data(), a.data(), a.size());
  BOOST_TEST(a == b);
  std::fill(b.begin(), b.end(), 0);
  copyOut(false, b.data(), a.data(), a.size());
  BOOST_TEST(a == b);
  copyOut(true, a.data(), a.data(), a.size());  // in place: nothing to do, nothing broken
  BOOST_TEST(a == b);
}

BOOST_AUTO_TEST_CASE(parses_sysfs_sizes) {
  BOOST_TEST(parseCacheSize("32768K") == 32 * kMiB);
  BOOST_TEST(parseCacheSize("32768K\n") == 32 * kMiB);
  BOOST_TEST(parseCacheSize("2M") == 2 * kMiB);
  BOOST_TEST(parseCacheSize("1G") == 1024 * kMiB);
  BOOST_TEST(parseCacheSize("512") == 512u);
  BOOST_TEST(parseCacheSize("") == 0u);
  BOOST_TEST(parseCacheSize("K") == 0u);
  BOOST_TEST(parseCacheSize("12KB") == 0u);
  BOOST_TEST(parseCacheSize("-4K") == 0u);
  BOOST_TEST(parseCacheSize("99999999999999999999K") == 0u);
}

BOOST_AUTO_TEST_CASE(one_shared_l3) {
  // Two CPUs, private L1d/L1i/L2, one L3 for both (this machine's table).
  TempDir t;
  for (int cpu = 0; cpu < 2; ++cpu) {
    const std::string self = std::to_string(cpu);
    addCache(t.path, cpu, 0, 1, "Data", "32K", self);
    addCache(t.path, cpu, 1, 1, "Instruction", "32K", self);
    addCache(t.path, cpu, 2, 2, "Unified", "1024K", self);
    addCache(t.path, cpu, 3, 3, "Unified", "32768K", "0-1");
  }
  const CacheInfo c = lastLevelCache(t.path);
  BOOST_TEST(c.level == 3);
  BOOST_TEST(c.bytes == 32 * kMiB);
  BOOST_TEST(c.instances == 1);
  std::string why;
  BOOST_TEST(streamMinBytes(c, 2, &why) == 16 * kMiB);
  BOOST_TEST(why.find("L3") != std::string::npos);
  BOOST_TEST(streamMinBytes(c, 4) == 8 * kMiB);
  BOOST_TEST(streamMinBytes(c, 0) == 32 * kMiB);  // no count: the whole cache
}

BOOST_AUTO_TEST_CASE(one_l3_per_ccx) {
  // Eight CPUs in two complexes of four, each with its own 16 MiB L3: 32 MiB in all. Entries
  // that are not CPUs (cpufreq, "cpu" alone) are skipped.
  TempDir t;
  for (int cpu = 0; cpu < 8; ++cpu) {
    addCache(t.path, cpu, 0, 2, "Unified", "512K", std::to_string(cpu));
    addCache(t.path, cpu, 1, 3, "Unified", "16M", cpu < 4 ? "0-3" : "4-7");
  }
  fs::create_directories(t.path / "cpufreq");
  fs::create_directories(t.path / "cpu");
  write(t.path / "cpuidle" / "cache" / "index0" / "level", "9");
  const CacheInfo c = lastLevelCache(t.path);
  BOOST_TEST(c.level == 3);
  BOOST_TEST(c.instances == 2);
  BOOST_TEST(c.total() == 32 * kMiB);
  BOOST_TEST(streamMinBytes(c, 8) == 4 * kMiB);
}

BOOST_AUTO_TEST_CASE(no_cache_table_means_never) {
  TempDir t;
  BOOST_TEST(lastLevelCache(t.path).level == 0);
  BOOST_TEST(lastLevelCache(t.path / "missing").level == 0);
  addCache(t.path, 0, 0, 2, "Unified", "garbage", "0");
  BOOST_TEST(lastLevelCache(t.path).level == 0);
  std::string why;
  BOOST_TEST(streamMinBytes(CacheInfo{}, 2, &why) == UINT64_MAX);
  BOOST_TEST(why.find("unknown") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(this_machine_parses) {
  // Whatever this machine's table holds, reading it must not throw; where there is one, its
  // largest level is at least 1 and its size positive.
  const CacheInfo c = lastLevelCache();
  if (c.level > 0) {
    BOOST_TEST(c.bytes > 0u);
    BOOST_TEST(c.instances > 0);
  }
}
