// transport.proxy_cpus in a job whose ranks span "hosts" (transport.host_id per rank, on lo):
// after a host allReduce over proxied fabric links, the proxy thread (strata-proxy) and the
// fabric progress thread (strata-fabric) of this rank run on the CPUs it expects.
//
//   strata-run -n 2 bash -c 'STRATA_TRANSPORT_HOST_ID=h$STRATA_RANK exec proxy-cpus EXPECT'
//
// EXPECT: one CPU list per rank, separated by ';' ("0;1"), or "mask" for the process's own mask
// (unbound threads). NUMA (optional): per rank the node its strata host buffers (memfd:strata
// in /proc/self/numa_maps) prefer, or "-" for the default policy ("0;-"). Exits 77 on a machine
// with fewer than 2 CPUs in this process's mask (unless PROXY_CPUS_BOUND says the test's wrapper
// bound this rank to one CPU on purpose).

#include <dirent.h>
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <strata/strata.hpp>

namespace {

std::string field(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      std::string v = line.substr(key.size() + 1);
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.erase(0, 1);
      return v;
    }
  }
  return "?";
}

/// Thread name -> Cpus_allowed_list, for this process's threads.
std::map<std::string, std::string> threads() {
  std::map<std::string, std::string> out;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string base = std::string("/proc/self/task/") + e->d_name;
    std::ifstream comm(base + "/comm");
    std::string name;
    std::getline(comm, name);
    out[name] = field(base + "/status", "Cpus_allowed_list");
  }
  closedir(d);
  return out;
}

}  // namespace

/// Item `rank` of a ';'-separated list.
std::string itemOf(const std::string& list, int rank) {
  size_t start = 0;
  for (int r = 0; r < rank; ++r) start = list.find(';', start) + 1;
  return list.substr(start, list.find(';', start) - start);
}

/// The policies of this process's strata host buffers ("prefer:0", "default"), each once.
std::string bufferPolicies() {
  std::ifstream in("/proc/self/numa_maps");
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.find("memfd:strata") == std::string::npos) continue;
    const size_t sp = line.find(' ');
    const std::string policy = line.substr(sp + 1, line.find(' ', sp + 1) - sp - 1);
    if (out.find(policy) == std::string::npos) out += (out.empty() ? "" : ",") + policy;
  }
  return out;
}

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: proxy-cpus 'CPUS;CPUS' | mask ['NODE;NODE']\n");
    return 2;
  }
  cpu_set_t mask;
  // PROXY_CPUS_BOUND: the wrapper narrowed this rank's mask on purpose (taskset).
  if (sched_getaffinity(0, sizeof mask, &mask) != 0 ||
      (CPU_COUNT(&mask) < 2 && std::getenv("PROXY_CPUS_BOUND") == nullptr)) {
    std::printf("SKIP: fewer than 2 CPUs in this process's mask\n");
    return 77;
  }
  try {
    auto comm = strata::Communicator::create();
    const int rank = comm->rank();
    std::vector<float> data(1 << 16, 1.0f);
    comm->allReduce(data.data(), data.data(), data.size(), strata::DataType::Float32,
                    strata::ReduceOp::Sum);
    for (float v : data) {
      if (v != static_cast<float>(comm->size())) {
        std::fprintf(stderr, "rank %d: allReduce gave %f\n", rank, v);
        return 1;
      }
    }
    std::string expect = argv[1];
    if (expect == "mask") {
      expect = field("/proc/self/status", "Cpus_allowed_list");
    } else {
      expect = itemOf(expect, rank);
    }
    const auto seen = threads();
    int bad = 0;
    for (const char* name : {"strata-proxy", "strata-fabric"}) {
      auto it = seen.find(name);
      if (it == seen.end()) {
        std::fprintf(stderr, "rank %d: no thread named %s\n", rank, name);
        ++bad;
      } else if (it->second != expect) {
        std::fprintf(stderr, "rank %d: %s runs on CPUs %s, expected %s\n", rank, name,
                     it->second.c_str(), expect.c_str());
        ++bad;
      } else {
        std::printf("rank %d: %s on CPUs %s\n", rank, name, it->second.c_str());
      }
    }
    if (argc == 3) {
      const std::string node = itemOf(argv[2], rank);
      const std::string want = node == "-" ? "default" : "prefer:" + node;
      const std::string got = bufferPolicies();
      if (got != want) {
        std::fprintf(stderr, "rank %d: host buffers' NUMA policy %s, expected %s\n", rank,
                     got.c_str(), want.c_str());
        ++bad;
      } else {
        std::printf("rank %d: host buffers %s\n", rank, got.c_str());
      }
    }
    float one = 1;  // every rank has looked before any leaves
    comm->allReduce(&one, &one, 1, strata::DataType::Float32, strata::ReduceOp::Sum);
    return bad == 0 ? 0 : 1;
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "proxy-cpus: %s\n", e.what());
    return 1;
  }
}
