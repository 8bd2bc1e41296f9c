// strata-info: what this installation of strata has, and how it is configured.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include <CLI/CLI.hpp>

#include <strata/strata.hpp>

#include "base/config_keys.hpp"
#include "bootstrap/registry.hpp"
#include "launch/contract.hpp"
#include "strata_info_features.h"
#include "topology/topology.hpp"
#include "watch/watch.hpp"

namespace {

const char* yesNo(bool b) {
  return b ? "yes" : "no";
}

/// A backend strata knows, and whether this build made it (a module whose dependency meson did
/// not find is "not built" here, which is no fault of the module path).
struct Known {
  const char* name;
  bool built;
  const char* needs;  ///< what the build lacked when it is not built
};

/// The status column and text of a backend that is not usable: "not built" when this build did
/// not make it, else "missing" (why it did not load).
std::pair<const char*, std::string> unusable(const Known& k, const std::string& error) {
  if (!k.built) {
    return {"not built", std::string("this build found no ") + k.needs +
                             " (install it and reconfigure, or put the module on module.path)"};
  }
  return {"missing", error};
}

/// Built-ins and modules of one kind: built-in (description), module (path), not built, or
/// missing (why).
void printModules(strata::backend::ModuleKind kind, std::initializer_list<Known> names,
                  const strata::Config& config) {
  for (const Known& k : names) {
    auto m = strata::bootstrap::findModule(kind, k.name, config);
    if (m.info) {
      std::printf("  %-6s %-9s %s\n", k.name, m.path.empty() ? "built-in" : "module",
                  m.path.empty() ? m.info->description : m.path.c_str());
    } else {
      auto [what, why] = unusable(k, m.error);
      std::printf("  %-6s %-9s %s\n", k.name, what, why.c_str());
    }
  }
}

/// Every algorithm of every collectives backend a communicator loads here (one rank unless
/// launched as a job), with what it accepts.
int listAlgorithms() {
  strata::Config config = strata::Config::load();
  auto comm = strata::Communicator::create(config);
  if (comm->rank() != 0) return 0;
  auto groups = comm->context().hostGroups();
  std::printf(
      "Collective algorithms (%d rank%s on %zu host%s; auto takes, per call, the first "
      "in this order that accepts it and prefers its size, else the first that accepts "
      "it)\n",
      comm->size(), comm->size() == 1 ? "" : "s", groups.size(), groups.size() == 1 ? "" : "s");
  for (const auto& a : comm->algorithms()) {
    std::string ops;
    for (const auto& op : a.ops) ops += (ops.empty() ? "" : ", ") + op;
    std::printf("\n  %s/%s\n    ops:    %s\n    memory: %s\n    %s\n", a.backend.c_str(),
                a.name.c_str(), ops.c_str(), a.memory.c_str(), a.description.c_str());
    if (!a.forcedFor.empty()) {
      std::string forced;
      for (const auto& op : a.forcedFor) forced += (forced.empty() ? "" : ", ") + op;
      std::printf("    forced by the configuration for: %s\n", forced.c_str());
    }
  }
  return 0;
}

/// The host collectives' tuning cache, found the way collectives/host/tuning.hpp documents it
/// (tools may not include it): $XDG_CACHE_HOME/strata/host-tuning.txt when XDG_CACHE_HOME is
/// absolute, else $HOME/.cache/strata/host-tuning.txt; empty without HOME.
std::string tuningCacheFile() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') return std::string(xdg) + "/strata/host-tuning.txt";
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0')
    return std::string(home) + "/.cache/strata/host-tuning.txt";
  return {};
}

/// strata-info --tuning: what the collectives backends measured at create and chose (one rank
/// unless launched as a job: rank 0 prints), then the tuning cache.
int showTuning() {
  strata::Config config = strata::Config::load();
  auto comm = strata::Communicator::create(config);
  if (comm->rank() != 0) return 0;
  const std::string report = comm->tuningReport();
  std::printf("%s", report.empty() ? "no collectives backend tuned anything\n" : report.c_str());
  if (comm->size() == 1) {
    std::printf(
        "\nOne rank has no peer to measure: run it as strata-run -n N strata-info --tuning to "
        "measure for N ranks per host.\n");
  }
  const std::string file = tuningCacheFile();
  if (file.empty()) {
    std::printf("\nTuning cache: none (neither XDG_CACHE_HOME nor HOME is set)\n");
    return 0;
  }
  std::ifstream in(file);
  if (!in) {
    std::printf("\nTuning cache: %s (absent)\n", file.c_str());
    return 0;
  }
  std::printf("\nTuning cache: %s\n", file.c_str());
  std::string line;
  while (std::getline(in, line)) std::printf("  %s\n", line.c_str());
  return 0;
}

/// strata-info --topology: this machine (or topology.file, or --topology-file) and where each
/// local rank would take its NIC, cores and NUMA node from (transport.fabric.nic applies).
int showTopology(const std::string& fileOption, int ranks, bool check, const std::string& sysfs) {
  const strata::Config config = strata::Config::load();
  const std::string file =
      fileOption.empty() ? strata::config::getString(config, "topology.file") : fileOption;
  const auto machine = strata::topology::Machine::load(file);
  const auto policy =
      strata::topology::NicPolicy::parse(strata::config::getString(config, "transport.fabric.nic"));
  if (ranks <= 0) {
    // One rank per GPU; without GPUs, one per NUMA node.
    ranks = std::max<int>(
        1, static_cast<int>(machine.gpus.empty() ? machine.numaNodes.size() : machine.gpus.size()));
  }
  const auto placements = strata::topology::place(machine, ranks, {}, policy);
  if (check) {
    // The pre-flight check alone: one line per finding, WARN for what costs speed or breaks.
    auto lines = strata::topology::preflight(machine, placements, sysfs);
    if (file.empty() && sysfs == "/sys") {
      // The transports' own lines (libfabric's FI_HMEM per NIC, CUDA peer access): they look
      // at this machine, so not for a recorded one.
      for (auto& l : strata::bootstrap::transportPreflight(config)) lines.push_back(std::move(l));
    } else {
      lines.push_back({"transports", strata::topology::CheckLine::State::Unknown,
                       "not asked: a recorded machine (--topology-file or --sysfs); they would "
                       "describe this one",
                       ""});
    }
    std::fputs(strata::topology::describe(lines).c_str(), stdout);
    return 0;
  }
  std::fputs(strata::topology::describe(machine, placements).c_str(), stdout);
  std::printf(
      "\n(local rank r uses GPU r mod the GPUs; host-only ranks are spread over the NUMA nodes "
      "in blocks here, where a running rank takes the node its CPU binding lies in. "
      "transport.fabric.nic = %s)\n",
      strata::config::getString(config, "transport.fabric.nic").c_str());
  return 0;
}

int run(bool showConfig, bool onlyConfig) {
  strata::Config config = strata::Config::load();
  if (!onlyConfig) {
    std::printf("strata %s\n\n", strata::versionString());
    std::printf("Dependencies found at build time\n");
    std::printf("  libpmix          %s\n", yesNo(STRATA_HAVE_PMIX));
    std::printf("  UCX              %s\n", yesNo(STRATA_HAVE_UCX));
    std::printf("  libfabric        %s\n", yesNo(STRATA_HAVE_LIBFABRIC));
    std::printf("  cuda             %s\n\n", yesNo(STRATA_HAVE_CUDA));
    std::string self = strata::bootstrap::libraryFile();
    std::printf("Library\n  %s%s\n\n", self.empty() ? "(unknown)" : self.c_str(),
                strata::bootstrap::isBuildTreeLibrary() ? " (build tree)" : "");
    std::printf("Module path (searched in this order)\n");
    auto searchPath = strata::bootstrap::moduleSearchPath(config);
    if (searchPath.empty()) std::printf("  (none: no module was built and module.path is empty)\n");
    for (const auto& d : searchPath) {
      std::printf("  %-18s %s\n", d.origin.c_str(), d.dir.c_str());
    }
    std::printf("\nBootstrap backends\n");
    const Known bootstrapBuilt[] = {{"pmix", STRATA_HAVE_PMIX, "libpmix"},
                                    {"ucx", STRATA_HAVE_UCX, "UCX"}};
    for (const auto& b : strata::bootstrap::listBackends(config)) {
      Known k{b.name.c_str(), true, ""};
      for (const Known& known : bootstrapBuilt) {
        if (b.name == known.name) k = known;
      }
      if (b.usable) {
        std::printf("  %-6s %-9s %s\n", b.name.c_str(), b.kind.c_str(),
                    b.path.empty() ? b.description.c_str() : b.path.c_str());
      } else {
        auto [what, why] = unusable(k, b.error);
        std::printf("  %-6s %-9s %s\n", b.name.c_str(), what, why.c_str());
      }
    }
    std::printf("\nTransports\n");
    printModules(strata::backend::ModuleKind::Transport,
                 {{"shm", true, ""},
                  {"fabric", STRATA_HAVE_LIBFABRIC, "libfabric"},
                  {"nvlink", STRATA_HAVE_CUDA, "CUDA toolkit"}},
                 config);
    std::printf("  transport.intra_node = %s, transport.inter_node = %s\n",
                config.get("transport.intra_node").value_or("").c_str(),
                config.get("transport.inter_node").value_or("").c_str());
    std::printf(
        "\nCollectives backends (strata-info --algorithms lists their algorithms, --tuning "
        "what they measured)\n");
    printModules(
        strata::backend::ModuleKind::Collectives,
        {{"host", true, ""}, {"cuda", STRATA_HAVE_CUDA_COLLECTIVES, "CUDA toolkit with nvcc"}},
        config);
    std::printf("\nbootstrap.backend = %s resolves to '%s' here\n",
                config.get("bootstrap.backend").value_or("auto").c_str(),
                strata::bootstrap::resolveBackendName(config).c_str());
  }
  if (showConfig) {
    if (!onlyConfig) std::printf("\nConfiguration\n");
    std::cout << config.describe();
  }
  return 0;
}

/// A variable of another process's environment (readable for the same user), or "".
std::string environOf(int32_t pid, const std::string& name) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string entry;
  while (std::getline(in, entry, '\0')) {
    if (entry.rfind(name + "=", 0) == 0) return entry.substr(name.size() + 1);
  }
  return {};
}

void printDump(const strata::watch::Reply& r, const std::string& from) {
  if (!r.error.empty()) {
    throw strata::Error(strata::ErrorCode::PeerLost, from + ": " + r.error);
  }
  std::printf("%s", r.text.c_str());
}

/// strata-info --job: what every rank of a live job is doing, asked through one of its
/// processes (docs/errors.md, "When a job stalls").
int askJob(int32_t pid, const std::string& address, double seconds) {
  namespace w = strata::watch;
  if (!address.empty()) {
    strata::Config config = strata::Config::load();
    std::string secret = strata::detectLaunch(config).secret;
    if (secret.empty()) {
      throw strata::Error(strata::ErrorCode::InvalidConfig,
                          "--address needs the job secret: set STRATA_SECRET or "
                          "bootstrap.secret_file as the job had it (or ask a process of this "
                          "host with --pid)");
    }
    printDump(w::askRemote(address, secret, w::makeRequest(w::RequestType::Dump, 0), seconds),
              address);
    return 0;
  }
  std::vector<int32_t> pids;
  if (pid > 0) {
    pids.push_back(pid);
  } else {
    // Processes of this host with a status service; under a launcher's environment (srun
    // --overlap --jobid, or strata-run's), only those of the same job.
    const char* slurmJob = std::getenv("SLURM_JOB_ID");
    const char* root = std::getenv("STRATA_ROOT");
    for (int32_t p : w::localServices()) {
      if (slurmJob && environOf(p, "SLURM_JOB_ID") != slurmJob) continue;
      if (!slurmJob && root && environOf(p, "STRATA_ROOT") != root) continue;
      pids.push_back(p);
    }
    if (pids.empty()) {
      throw strata::Error(
          strata::ErrorCode::PeerLost,
          std::string("no strata process with a status service on this host") +
              (slurmJob ? std::string(" in Slurm job ") + slurmJob : std::string()) +
              " (a job's ranks run one while they hold a bootstrap of 2 or more ranks, unless "
              "watch.enabled = false; under Slurm run this on one of the job's nodes: srun "
              "--overlap --jobid JOB -w NODE -n 1 strata-info --job)");
    }
  }
  // One process per job is enough: it asks all the others.
  std::map<uint64_t, int32_t> jobs;
  std::string lastError;
  for (int32_t p : pids) {
    try {
      auto list = w::askLocal(p, w::makeRequest(w::RequestType::List, 0), seconds);
      for (const auto& s : list.reports) jobs.emplace(s.jobId, p);
    } catch (const strata::Error& e) {
      lastError = e.what();
    }
  }
  if (jobs.empty()) {
    throw strata::Error(
        strata::ErrorCode::PeerLost,
        "no strata job answered" + (lastError.empty() ? std::string() : ": " + lastError));
  }
  bool first = true;
  for (const auto& [job, p] : jobs) {
    if (!first) std::printf("\n");
    first = false;
    printDump(w::askLocal(p, w::makeRequest(w::RequestType::Dump, job), seconds),
              "process " + std::to_string(p));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"strata-info: version, build features, backends and configuration of strata"};
  bool showConfig = false;
  bool version = false;
  bool algorithms = false;
  app.add_flag("--algorithms", algorithms,
               "create a communicator (one rank, or the job's ranks under a launcher) and list "
               "every algorithm of every loaded collectives backend with what it accepts");
  bool tuning = false;
  app.add_flag("--tuning", tuning,
               "create a communicator (one rank, or the job's ranks under a launcher: strata-run "
               "-n N strata-info --tuning) and print what the collectives measured at create, "
               "the crossovers they derived, and the tuning cache");
  bool topology = false;
  std::string topologyFile;
  int ranks = 0;
  app.add_flag("--topology", topology,
               "print this machine's GPUs, NICs, NUMA nodes and the paths between them, and the "
               "NIC, cores and NUMA node each local rank would take (docs/topology.md)");
  app.add_option("--topology-file", topologyFile,
                 "with --topology: an hwloc XML file (lstopo --of xml) instead of this machine "
                 "(also topology.file, STRATA_TOPOLOGY_FILE)");
  bool check = false;
  std::string sysfs = "/sys";
  app.add_flag("--check", check,
               "pre-flight check of this node for its local ranks (--ranks, --topology-file): "
               "NICs and RDMA devices, the IOMMU mode, PCIe ACS between each GPU and its NIC, "
               "MPS, and the transports' own (FI_HMEM per NIC, CUDA peer access, multicast); one "
               "line each, with what strata does about it (docs/topology.md)");
  app.add_option("--sysfs", sysfs, "with --check: a recorded sysfs tree instead of /sys");
  app.add_option("--ranks", ranks,
                 "with --topology: local ranks to place (default: one per GPU, else one per "
                 "NUMA node)")
      ->check(CLI::Range(1, 4096));
  app.add_flag("--config", showConfig,
               "print the effective value of every configuration key and where it came from");
  app.add_flag("--version", version, "print the version only");
  bool job = false;
  int32_t pid = 0;
  std::string address;
  double seconds = 5;
  app.add_flag("--job", job,
               "ask a live job what every rank is doing (its call, sequence number, the rank it "
               "waits for and since when), through a strata process of this host");
  app.add_option("--pid", pid, "with --job: ask through this process (same user)");
  app.add_option("--address", address,
                 "with --job: ask the status service at HOST:PORT (a rank's, as --job prints "
                 "them) with the job secret (STRATA_SECRET or bootstrap.secret_file)");
  app.add_option("--timeout", seconds, "with --job: seconds to wait for the answer")
      ->check(CLI::Range(0.1, 600.0));
  CLI11_PARSE(app, argc, argv);
  if ((pid != 0 || !address.empty()) && !job) {
    std::fprintf(stderr, "strata-info: --pid and --address go with --job\n");
    return 2;
  }
  try {
    if (version) {
      std::printf("strata %s\n", strata::versionString());
      return 0;
    }
    if (topology || check || !topologyFile.empty()) {
      return showTopology(topologyFile, ranks, check, sysfs);
    }
    if (algorithms) return listAlgorithms();
    if (tuning) return showTuning();
    if (job) return askJob(pid, address, seconds);
    return run(showConfig, showConfig);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "strata-info: %s: %s\n", std::string(strata::toString(e.code())).c_str(),
                 e.what());
    return 1;
  }
}
