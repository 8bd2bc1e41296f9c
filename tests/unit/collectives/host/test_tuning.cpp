// The host collectives' tuning (collectives/host/tuning.hpp): the cost model on the figures of
// two real machines (one where single copy wins, one where the slots win by far), the per-machine
// cache file, the encoding rank 0 broadcasts, and the probe against this process itself.
#define BOOST_TEST_MODULE tuning
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <strata/error.hpp>

#include "collectives/host/tuning.hpp"

using strata::Error;
using strata::ErrorCode;
using strata::collectives::Choices;
using strata::collectives::decodeSamples;
using strata::collectives::deriveChoices;
using strata::collectives::encodeSamples;
using strata::collectives::loadCachedSamples;
using strata::collectives::MachineKey;
using strata::collectives::probeReads;
using strata::collectives::ProbeSample;
using strata::collectives::storeCachedSamples;
using strata::collectives::tuningCacheFile;

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

// The probe's three sizes with the given process_vm_readv / memcpy ratios (memcpy at 48 GB/s).
std::vector<ProbeSample> withRatios(std::initializer_list<double> ratios) {
  const uint64_t sizes[] = {64 * kKiB, kMiB, 8 * kMiB};
  std::vector<ProbeSample> out;
  size_t i = 0;
  for (double r : ratios) out.push_back({sizes[i++], 48.0 * r, 48.0});
  return out;
}

bool contains(const std::string& text, std::string_view fragment) {
  return text.find(fragment) != std::string::npos;
}

// Passes when `fn` throws strata::Error(code) whose message contains every fragment.
template <typename Fn>
void expectError(ErrorCode code, Fn&& fn, std::initializer_list<std::string_view> fragments) {
  try {
    fn();
    BOOST_ERROR("no exception thrown");
  } catch (const Error& e) {
    BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(code),
               "code " << toString(e.code()) << ": " << e.what());
    const std::string msg = e.what();
    for (auto f : fragments) {
      BOOST_TEST(contains(msg, f), "'" << f << "' missing from: " << msg);
    }
  }
}

// A fresh folder under the system's temporary directory, removed with everything in it.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("strata-test-tuning-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

MachineKey someKey(int ranks = 2) {
  MachineKey key;
  key.cpuModel = "AMD EPYC 7763 64-Core Processor";
  key.kernel = "6.1.0-28-amd64";
  key.ranksPerHost = ranks;
  key.cores = 2;
  return key;
}

void writeFile(const fs::path& file, const std::string& content) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << content;
}

std::vector<std::string> readLines(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool sameSamples(const std::vector<ProbeSample>& a, const std::vector<ProbeSample>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].bytes != b[i].bytes || a[i].vmGBs != b[i].vmGBs || a[i].mapGBs != b[i].mapGBs) {
      return false;
    }
  }
  return true;
}

constexpr const char* kHeader = "# strata host tuning cache, version 1\n";
constexpr const char* kGoodEntry =
    "cpu=\"AMD EPYC 7763 64-Core Processor\" kernel=\"6.1.0-28-amd64\" ranks=2 cores=2 "
    "samples=65536:12.3:44.1,1048576:13.5:48.2\n";

// Loading `content` fails, naming the file and `line`, and the fragment.
void expectBadFile(const std::string& content, int line, std::string_view fragment) {
  TempDir dir;
  const fs::path file = dir.path / "host-tuning.txt";
  writeFile(file, content);
  std::string problem = "stale";
  auto loaded = loadCachedSamples(file, someKey(), &problem);
  BOOST_TEST(!loaded.has_value());
  const std::string where = file.string() + ":" + std::to_string(line) + ":";
  BOOST_TEST(contains(problem, where), "'" << where << "' missing from: " << problem);
  BOOST_TEST(contains(problem, fragment), "'" << fragment << "' missing from: " << problem);
  // The next store drops the bad lines and the file loads again.
  BOOST_TEST(storeCachedSamples(file, someKey(), withRatios({0.3})) == "");
  BOOST_TEST(loadCachedSamples(file, someKey(), &problem).has_value());
  BOOST_TEST(problem == "");
}

// Restores an environment variable when the test ends.
struct SavedEnv {
  std::string name;
  std::optional<std::string> value;
  explicit SavedEnv(std::string n) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) value = v;
  }
  ~SavedEnv() {
    if (value) {
      ::setenv(name.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
};

}  // namespace

// --- the cost model ---------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(slots_win_where_process_vm_readv_is_slow) {
  // 13.5 against 48 GB/s: ratio 0.28 at every size.
  std::vector<ProbeSample> samples;
  for (uint64_t s : {64 * kKiB, kMiB, 8 * kMiB}) samples.push_back({s, 13.5, 48.0});
  Choices c = deriveChoices(samples, 2, 2);
  BOOST_TEST(c.gatherSingleCopyMin == UINT64_MAX);
  BOOST_TEST(c.allReduceSingleCopyMin == UINT64_MAX);
  BOOST_TEST_REQUIRE(c.why.size() == 2u);
  for (const std::string& line : c.why) {
    BOOST_TEST(contains(line, "0.28"), line);
    BOOST_TEST(contains(line, "slots at every size"), line);
    BOOST_TEST(!contains(line, "\n"), line);
  }
  BOOST_TEST(contains(c.why[0], "0.5"), c.why[0]);
  BOOST_TEST(contains(c.why[1], "0.55"), c.why[1]);
}

BOOST_AUTO_TEST_CASE(single_copy_wins_where_process_vm_readv_is_fast) {
  // 6.8 against 11.6 GB/s: ratio 0.59 at every size, above both rules: from the smallest sample.
  std::vector<ProbeSample> samples;
  for (uint64_t s : {64 * kKiB, kMiB, 8 * kMiB}) samples.push_back({s, 6.8, 11.6});
  Choices c = deriveChoices(samples, 2, 2);
  BOOST_TEST(c.gatherSingleCopyMin == 64 * kKiB);
  BOOST_TEST(c.allReduceSingleCopyMin == 64 * kKiB);
  BOOST_TEST_REQUIRE(c.why.size() == 2u);
  BOOST_TEST(contains(c.why[0], "single copy from 64 KiB"), c.why[0]);
  BOOST_TEST(contains(c.why[1], "single copy from 64 KiB"), c.why[1]);
  BOOST_TEST(contains(c.why[0], "0.59"), c.why[0]);
}

BOOST_AUTO_TEST_CASE(a_ratio_crossing_between_samples_gives_the_larger_size) {
  Choices c = deriveChoices(withRatios({0.45, 0.6, 0.62}), 2, 2);
  BOOST_TEST(c.gatherSingleCopyMin == kMiB);
  BOOST_TEST(c.allReduceSingleCopyMin == kMiB);
  BOOST_TEST(contains(c.why[0], "single copy from 1 MiB"), c.why[0]);

  // Between the two rules: allGather's single copy from 64 KiB, allReduce's from 1 MiB.
  c = deriveChoices(withRatios({0.52, 0.56, 0.6}), 2, 2);
  BOOST_TEST(c.gatherSingleCopyMin == 64 * kKiB);
  BOOST_TEST(c.allReduceSingleCopyMin == kMiB);

  // Exactly on the rule counts as holding.
  c = deriveChoices({{64 * kKiB, 6.0, 12.0}}, 2, 2);
  BOOST_TEST(c.gatherSingleCopyMin == 64 * kKiB);
  BOOST_TEST(c.allReduceSingleCopyMin == UINT64_MAX);
}

BOOST_AUTO_TEST_CASE(a_dip_at_the_largest_size_means_never) {
  Choices c = deriveChoices(withRatios({0.6, 0.6, 0.4}), 2, 2);
  BOOST_TEST(c.gatherSingleCopyMin == UINT64_MAX);
  BOOST_TEST(c.allReduceSingleCopyMin == UINT64_MAX);
  // A dip in the middle: only the sizes above it.
  c = deriveChoices(withRatios({0.6, 0.4, 0.6}), 2, 2);
  BOOST_TEST(c.gatherSingleCopyMin == 8 * kMiB);
  BOOST_TEST(c.allReduceSingleCopyMin == 8 * kMiB);
}

BOOST_AUTO_TEST_CASE(samples_in_any_order_decide_alike) {
  auto samples = withRatios({0.45, 0.6, 0.62});
  std::vector<ProbeSample> reversed(samples.rbegin(), samples.rend());
  Choices c = deriveChoices(reversed, 2, 2);
  BOOST_TEST(c.gatherSingleCopyMin == kMiB);
  BOOST_TEST(c.allReduceSingleCopyMin == kMiB);
  // A zero memcpy rate is no evidence for single copy.
  c = deriveChoices({{64 * kKiB, 10.0, 0.0}}, 2, 2);
  BOOST_TEST(c.gatherSingleCopyMin == UINT64_MAX);
}

// More ranks than cores: the ratios needed shrink by the square of ranks per core from where a
// call needs more than one slot chunk per peer. This machine's figures (AMD EPYC, 2 vCPUs:
// 0.19, 0.27, 0.24 at 64 KiB, 1 MiB, 4 MiB; 512 KiB chunks at 4 ranks): the slots at 2 ranks;
// at 4 ranks single copy for the gather family from 512 KiB per rank, never for allReduce, as
// measured side by side there (allGather: single copy ahead from 4 MiB per rank, 2x slower at
// 256 KiB; allReduce: two-shot ahead at every size).
BOOST_AUTO_TEST_CASE(oversubscribed_hosts_favour_single_copy) {
  const std::vector<ProbeSample> epyc{
      {64 * kKiB, 10.8, 56.4}, {kMiB, 12.95, 48.8}, {4 * kMiB, 8.6, 35.5}};
  Choices two = deriveChoices(epyc, 2, 2, kMiB);
  BOOST_TEST(two.gatherSingleCopyMin == UINT64_MAX);
  BOOST_TEST(two.allReduceSingleCopyMin == UINT64_MAX);
  Choices four = deriveChoices(epyc, 4, 2, 512 * kKiB);
  BOOST_TEST(four.gatherSingleCopyMin == 512 * kKiB);
  BOOST_TEST(four.allReduceSingleCopyMin == UINT64_MAX);
  BOOST_TEST(contains(four.why[0], "ranks per core"), four.why[0]);
  // Without the chunk size nothing changes.
  Choices unknownChunk = deriveChoices(epyc, 4, 2);
  BOOST_TEST(unknownChunk.gatherSingleCopyMin == UINT64_MAX);
  // Fewer ranks than cores changes nothing.
  Choices spare = deriveChoices(epyc, 2, 64, kMiB);
  BOOST_TEST(spare.gatherSingleCopyMin == UINT64_MAX);
}

BOOST_AUTO_TEST_CASE(no_samples_means_the_slots) {
  Choices c = deriveChoices({}, 4, 8);
  BOOST_TEST(c.gatherSingleCopyMin == UINT64_MAX);
  BOOST_TEST(c.allReduceSingleCopyMin == UINT64_MAX);
  BOOST_TEST_REQUIRE(c.why.size() == 1u);
  BOOST_TEST(contains(c.why[0], "no measurement"), c.why[0]);
  BOOST_TEST(contains(c.why[0], "4 ranks per host, 8 cores"), c.why[0]);
}

// --- the machine key --------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(machine_key_describes_this_machine) {
  MachineKey key = MachineKey::current(3);
  BOOST_TEST(!key.cpuModel.empty());
  BOOST_TEST(!key.kernel.empty());
  BOOST_TEST(key.ranksPerHost == 3);
  BOOST_TEST(key.cores >= 1);
  BOOST_TEST((key == MachineKey::current(3)));
  BOOST_TEST(!(key == MachineKey::current(4)));
  const std::string text = key.text();
  BOOST_TEST(contains(text, "cpu \"" + key.cpuModel + "\""), text);
  BOOST_TEST(contains(text, "kernel " + key.kernel), text);
  BOOST_TEST(contains(text, "3 ranks per host, " + std::to_string(key.cores) + " cores"), text);
}

// --- the cache file ---------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(cache_file_location) {
  SavedEnv xdg("XDG_CACHE_HOME"), home("HOME");
  ::setenv("XDG_CACHE_HOME", "/tmp/xdg-cache", 1);
  ::setenv("HOME", "/home/someone", 1);
  auto file = tuningCacheFile();
  BOOST_TEST_REQUIRE(file.has_value());
  BOOST_TEST(file->string() == "/tmp/xdg-cache/strata/host-tuning.txt");

  ::unsetenv("XDG_CACHE_HOME");
  file = tuningCacheFile();
  BOOST_TEST_REQUIRE(file.has_value());
  BOOST_TEST(file->string() == "/home/someone/.cache/strata/host-tuning.txt");

  // The XDG specification: a relative path is ignored.
  ::setenv("XDG_CACHE_HOME", "relative/cache", 1);
  file = tuningCacheFile();
  BOOST_TEST_REQUIRE(file.has_value());
  BOOST_TEST(file->string() == "/home/someone/.cache/strata/host-tuning.txt");

  ::unsetenv("XDG_CACHE_HOME");
  ::unsetenv("HOME");
  BOOST_TEST(!tuningCacheFile().has_value());
}

BOOST_AUTO_TEST_CASE(store_then_load_round_trips_exactly) {
  TempDir dir;
  const fs::path file = dir.path / "nested" / "strata" / "host-tuning.txt";  // folders created
  MachineKey key = someKey();
  key.cpuModel = "Weird \"CPU\" \\ model\twith\nnewline";
  const std::vector<ProbeSample> samples = {
      {64 * kKiB, 12.345678901234567, 1.0 / 3.0}, {kMiB, 13.5, 48.2}, {8 * kMiB, 1e-7, 4.4e12}};
  BOOST_TEST(storeCachedSamples(file, key, samples) == "");
  const auto lines = readLines(file);
  BOOST_TEST_REQUIRE(lines.size() == 2u);  // the header and one entry, on one line
  BOOST_TEST(lines[0] == "# strata host tuning cache, version 1");

  std::string problem = "stale";
  auto loaded = loadCachedSamples(file, key, &problem);
  BOOST_TEST(problem == "");
  BOOST_TEST_REQUIRE(loaded.has_value());
  BOOST_TEST(sameSamples(*loaded, samples));
  BOOST_TEST(loadCachedSamples(file, key, nullptr).has_value());

  // No temporary file is left behind.
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(file.parent_path())) {
    (void)e;
    ++files;
  }
  BOOST_TEST(files == 1u);
}

BOOST_AUTO_TEST_CASE(the_documented_line_loads) {
  TempDir dir;
  const fs::path file = dir.path / "host-tuning.txt";
  writeFile(file, std::string(kHeader) + "\n# a comment\n" + kGoodEntry);
  std::string problem;
  auto loaded = loadCachedSamples(file, someKey(), &problem);
  BOOST_TEST(problem == "");
  BOOST_TEST_REQUIRE(loaded.has_value());
  BOOST_TEST(sameSamples(*loaded, {{65536, 12.3, 44.1}, {1048576, 13.5, 48.2}}));
}

BOOST_AUTO_TEST_CASE(another_key_or_no_file_gives_nothing) {
  TempDir dir;
  const fs::path file = dir.path / "host-tuning.txt";
  std::string problem = "stale";
  BOOST_TEST(!loadCachedSamples(file, someKey(), &problem).has_value());  // no file
  BOOST_TEST(problem == "");

  BOOST_TEST(storeCachedSamples(file, someKey(), withRatios({0.3, 0.3})) == "");
  MachineKey other = someKey();
  other.cores = 4;
  BOOST_TEST(!loadCachedSamples(file, other, &problem).has_value());
  BOOST_TEST(problem == "");
  other = someKey();
  other.kernel = "6.1.0-29-amd64";
  BOOST_TEST(!loadCachedSamples(file, other, &problem).has_value());
  other = someKey(4);
  BOOST_TEST(!loadCachedSamples(file, other, &problem).has_value());
  other = someKey();
  other.cpuModel = "Intel Xeon";
  BOOST_TEST(!loadCachedSamples(file, other, &problem).has_value());
  BOOST_TEST(problem == "");
}

BOOST_AUTO_TEST_CASE(storing_keeps_other_keys_and_replaces_its_own) {
  TempDir dir;
  const fs::path file = dir.path / "host-tuning.txt";
  const auto first = withRatios({0.3, 0.3, 0.3});
  const auto second = withRatios({0.6});
  BOOST_TEST(storeCachedSamples(file, someKey(2), first) == "");
  BOOST_TEST(storeCachedSamples(file, someKey(4), second) == "");
  auto a = loadCachedSamples(file, someKey(2), nullptr);
  auto b = loadCachedSamples(file, someKey(4), nullptr);
  BOOST_TEST_REQUIRE(a.has_value());
  BOOST_TEST_REQUIRE(b.has_value());
  BOOST_TEST(sameSamples(*a, first));
  BOOST_TEST(sameSamples(*b, second));

  // Replacing an entry leaves one line for that key.
  const auto third = withRatios({0.7, 0.7});
  BOOST_TEST(storeCachedSamples(file, someKey(2), third) == "");
  BOOST_TEST(readLines(file).size() == 3u);
  a = loadCachedSamples(file, someKey(2), nullptr);
  BOOST_TEST_REQUIRE(a.has_value());
  BOOST_TEST(sameSamples(*a, third));
}

BOOST_AUTO_TEST_CASE(at_most_32_entries_the_oldest_dropped) {
  TempDir dir;
  const fs::path file = dir.path / "host-tuning.txt";
  for (int ranks = 1; ranks <= 33; ++ranks) {
    BOOST_TEST_REQUIRE(storeCachedSamples(file, someKey(ranks), withRatios({0.3})) == "");
  }
  BOOST_TEST(readLines(file).size() == 33u);  // the header and 32 entries
  std::string problem;
  BOOST_TEST(!loadCachedSamples(file, someKey(1), &problem).has_value());
  BOOST_TEST(problem == "");
  BOOST_TEST(loadCachedSamples(file, someKey(2), nullptr).has_value());
  BOOST_TEST(loadCachedSamples(file, someKey(33), nullptr).has_value());
}

BOOST_AUTO_TEST_CASE(a_corrupted_file_is_ignored_naming_file_and_line) {
  const std::string header = kHeader;
  expectBadFile("", 1, "not a strata host tuning cache");
  expectBadFile("garbage\n" + std::string(kGoodEntry), 1, "not a strata host tuning cache");
  expectBadFile("# strata host tuning cache, version 2\n" + std::string(kGoodEntry), 1,
                "version 1");
  expectBadFile(header + kGoodEntry + "this is not an entry\n", 3, "key=value");
  expectBadFile(header + "cpu=\"AMD EPYC kernel=\"x\" ranks=2 cores=2 samples=1:1:1\n", 2,
                "no space after");
  expectBadFile(header + "cpu=\"AMD EPYC kernel=x ranks=2 cores=2 samples=1:1:1\n", 2,
                "unterminated");
  expectBadFile(header + "cpu=\"A\\q\" kernel=x ranks=2 cores=2 samples=1:1:1\n", 2, "escape");
  expectBadFile(header + "cpu=a kernel=x ranks=2 cores=2\n", 2, "no 'samples'");
  expectBadFile(header + "cpu=a kernel=x ranks=2 cores=2 samples=1:1:1 color=red\n", 2,
                "unknown key 'color'");
  expectBadFile(header + "cpu=a cpu=b kernel=x ranks=2 cores=2 samples=1:1:1\n", 2, "twice");
  expectBadFile(header + "cpu=a kernel=x ranks=two cores=2 samples=1:1:1\n", 2, "ranks=two");
  expectBadFile(header + "cpu=a kernel=x ranks=2 cores=2 samples=65536:1.5\n", 2,
                "not bytes:vm:map");
  expectBadFile(header + "cpu=a kernel=x ranks=2 cores=2 samples=65536:1.5:2x\n", 2,
                "not bytes:vm:map");
  // Only the first bad line is named, with a count of the others.
  expectBadFile(header + "junk\n" + kGoodEntry + "junk\n", 2, "1 more bad lines");
}

BOOST_AUTO_TEST_CASE(bad_values_are_ignored_naming_file_and_line) {
  const std::string entry =
      "cpu=\"AMD EPYC 7763 64-Core Processor\" kernel=\"6.1.0-28-amd64\" "
      "ranks=2 cores=2 samples=";
  const std::string header = std::string(kHeader) + kGoodEntry;  // the key's entry is line 2
  expectBadFile(header + entry + "65536:0:44.1\n", 3, "process_vm_readv rate 0");
  expectBadFile(header + entry + "65536:12.3:-1\n", 3, "memcpy rate -1");
  expectBadFile(header + entry + "65536:inf:44.1\n", 3, "process_vm_readv rate inf");
  expectBadFile(header + entry + "65536:12.3:nan\n", 3, "memcpy rate nan");
  expectBadFile(header + entry + "1048576:1:1,65536:1:1\n", 3, "not increasing");
  expectBadFile(header + entry + "65536:1:1,65536:1:1\n", 3, "not increasing");
  expectBadFile(header + entry + "0:1:1\n", 3, "size 0");
  expectBadFile(header + entry + "\n", 3, "no samples");
  std::string nine;
  for (int i = 1; i <= 9; ++i) nine += (i > 1 ? "," : "") + std::to_string(i) + ":1:1";
  expectBadFile(header + entry + nine + "\n", 3, "more than 8");
}

BOOST_AUTO_TEST_CASE(store_refuses_what_load_would_reject) {
  TempDir dir;
  const fs::path file = dir.path / "host-tuning.txt";
  BOOST_TEST(contains(storeCachedSamples(file, someKey(), {}), "no samples"));
  BOOST_TEST(contains(storeCachedSamples(file, someKey(), {{65536, 1.0, 0.0}}), "memcpy rate"));
  BOOST_TEST(!fs::exists(file));

  // A folder that cannot be created: the cache is not written, and it says so.
  writeFile(dir.path / "plain-file", "x");
  const std::string failed =
      storeCachedSamples(dir.path / "plain-file" / "host-tuning.txt", someKey(), withRatios({1}));
  BOOST_TEST(contains(failed, "plain-file"), failed);
}

// --- the encoding -----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(encoding_round_trips) {
  const std::vector<ProbeSample> samples = {
      {64 * kKiB, 12.345678901234567, 1.0 / 3.0}, {kMiB, 0.0, 48.2}, {8 * kMiB, 1e-300, 4.4e12}};
  const auto bytes = encodeSamples(samples);
  BOOST_TEST_REQUIRE(bytes.size() == 8u + 24u * samples.size());
  BOOST_TEST(std::string(bytes.begin(), bytes.begin() + 4) == "STTU");
  BOOST_TEST(bytes[4] == 1);  // version 1, little-endian
  BOOST_TEST(bytes[5] == 0);
  BOOST_TEST(bytes[6] == 3);  // count
  BOOST_TEST(bytes[7] == 0);
  BOOST_TEST(bytes[8 + 2] == 1);  // 65536 = 0x10000, little-endian
  BOOST_TEST(sameSamples(decodeSamples(bytes.data(), bytes.size()), samples));

  const auto none = encodeSamples({});
  BOOST_TEST(none.size() == 8u);
  BOOST_TEST(decodeSamples(none.data(), none.size()).empty());

  const auto eight = encodeSamples(std::vector<ProbeSample>(8, {1, 1.0, 1.0}));
  BOOST_TEST(decodeSamples(eight.data(), eight.size()).size() == 8u);
  expectError(ErrorCode::InvalidArgument,
              [] {
                encodeSamples(std::vector<ProbeSample>(9, {1, 1.0, 1.0}));
              },
              {"9 samples"});
}

BOOST_AUTO_TEST_CASE(decoding_rejects_malformed_input) {
  const auto good = encodeSamples(withRatios({0.3, 0.6}));
  auto decode = [](std::vector<uint8_t> bytes) {
    return [bytes] { decodeSamples(bytes.data(), bytes.size()); };
  };
  auto setF64 = [](std::vector<uint8_t>& bytes, size_t at, double v) {
    std::memcpy(bytes.data() + at, &v, sizeof v);  // the test runs on little-endian machines
  };

  auto bad = good;
  bad[0] = 'X';
  expectError(ErrorCode::ProtocolError, decode(bad), {"bad magic"});
  bad = good;
  bad[4] = 2;
  expectError(ErrorCode::ProtocolError, decode(bad), {"unknown version 2"});
  bad = good;
  bad[6] = 9;
  expectError(ErrorCode::ProtocolError, decode(bad), {"count 9"});
  bad = good;
  bad[6] = 1;
  bad[7] = 1;  // 257
  expectError(ErrorCode::ProtocolError, decode(bad), {"count 257"});

  expectError(ErrorCode::ProtocolError, decode({}), {"truncated", "magic"});
  expectError(ErrorCode::ProtocolError, decode({'S', 'T', 'T', 'U', 1, 0}), {"truncated", "count"});
  bad = good;
  bad.pop_back();
  expectError(ErrorCode::ProtocolError, decode(bad), {"truncated", "map rate"});
  bad = good;
  bad.resize(8 + 24 + 4);
  expectError(ErrorCode::ProtocolError, decode(bad), {"truncated", "bytes"});
  bad = good;
  bad.push_back(0);
  expectError(ErrorCode::ProtocolError, decode(bad), {"trailing"});
  expectError(ErrorCode::ProtocolError, [] { decodeSamples(nullptr, 0); }, {"truncated"});

  bad = good;
  setF64(bad, 8 + 8, std::numeric_limits<double>::quiet_NaN());
  expectError(ErrorCode::ProtocolError, decode(bad), {"sample 1", "process_vm_readv rate nan"});
  bad = good;
  setF64(bad, 8 + 24 + 16, std::numeric_limits<double>::infinity());
  expectError(ErrorCode::ProtocolError, decode(bad), {"sample 2", "memcpy rate inf"});
  bad = good;
  setF64(bad, 8 + 24 + 8, -1.0);
  expectError(ErrorCode::ProtocolError, decode(bad), {"sample 2", "process_vm_readv rate -1"});
}

// --- the probe --------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(probe_reads_this_process) {
  std::vector<char> buffer(kMiB);
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<char>(i * 7);
  const auto samples = probeReads(::getpid(), reinterpret_cast<uint64_t>(buffer.data()),
                                  buffer.data(), buffer.size());
  BOOST_TEST_REQUIRE(samples.size() == 2u);
  BOOST_TEST(samples[0].bytes == 64 * kKiB);
  BOOST_TEST(samples[1].bytes == kMiB);
  for (const ProbeSample& s : samples) {
    BOOST_TEST((std::isfinite(s.vmGBs) && s.vmGBs > 0), s.vmGBs);
    BOOST_TEST((std::isfinite(s.mapGBs) && s.mapGBs > 0), s.mapGBs);
  }
  // Below the smallest size there is nothing to measure.
  BOOST_TEST(probeReads(::getpid(), reinterpret_cast<uint64_t>(buffer.data()), buffer.data(),
                        64 * kKiB - 1)
                 .empty());
}

BOOST_AUTO_TEST_CASE(probe_of_a_bad_address_throws_system_error) {
  std::vector<char> buffer(kMiB);
  const std::string pid = std::to_string(::getpid());
  // Page 0 is never mapped.
  expectError(ErrorCode::SystemError,
              [&] { probeReads(::getpid(), 8, buffer.data(), buffer.size()); },
              {"process_vm_readv", "pid " + pid, std::strerror(EFAULT)});
}
