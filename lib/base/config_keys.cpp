#include "base/config_keys.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include <strata/error.hpp>

namespace strata::config {

namespace {

// The one table of configuration keys. tools/dev/gen-config-doc.py parses this table to write
// docs/configuration.md, so keep one brace-enclosed entry per key, string literals only, in the
// field order of KeyInfo: {key, Type::X, default, choices, help, mustMatch}.
// For Int and Double keys, `choices` holds an optional range "min..max" (either side may be empty).
// BEGIN KEYS
constexpr KeyInfo kKeys[] = {
    {"log.level", Type::Enum, "warn", "error|warn|info|debug|trace",
     "Least severe message that is printed. Nothing is printed at warn on success.", false},
    {"log.file", Type::String, "", "",
     "File that log lines are appended to. Empty means standard error.", false},
    {"module.path", Type::String, "", "",
     "Colon-separated directories searched first for modules (bootstrap and transport "
     "backends). Rarely needed: the libstrata of a build tree finds that build tree's modules, "
     "an installed libstrata the strata directory next to it, then the configured module "
     "directory (docs/backends.md).",
     false},
    {"bootstrap.backend", Type::Enum, "auto", "auto|tcp|pmix|ucx",
     "Bootstrap backend. auto picks PMIx when a PMIx server is present, else TCP. Every rank must "
     "choose the same.",
     true},
    {"bootstrap.timeout", Type::Double, "30", "0..",
     "Deadline in seconds of every blocking bootstrap call (send, recv, collectives). 0 means no "
     "deadline.",
     false},
    {"bootstrap.connect_timeout", Type::Double, "60", "0..",
     "Seconds a rank keeps trying to reach rank 0's rendezvous before it gives up. 0 means no "
     "deadline.",
     false},
    {"bootstrap.handshake_timeout", Type::Double, "5", "0..",
     "Seconds an accepted connection has to prove knowledge of the job secret before it is "
     "closed. At the rendezvous the same time, counted from the accept, also covers the rank's "
     "check-in record: a rank that authenticates and then sends nothing is closed (logged at "
     "warn) instead of being kept until bootstrap.connect_timeout.",
     false},
    {"bootstrap.spin_us", Type::Int, "-1", "-1..",
     "Microseconds a waiting bootstrap call (tcp, ucx, the pmix point-to-point path) polls "
     "before it sleeps. Higher values cut latency and cost CPU. -1 (auto): 200 when this host "
     "runs no more ranks than it has CPUs, else 100. When ranks outnumber CPUs, the spin yields "
     "the CPU between polls.",
     false},
    {"bootstrap.collectives", Type::Enum, "auto", "auto|log|star",
     "Algorithms of the tcp bootstrap's own allGather, broadcast and barrier. log: Bruck "
     "allGather, binomial broadcast, dissemination barrier (log2 N rounds). star: small ones "
     "through rank 0 in two sweeps (fewer rounds; best when ranks share CPUs). auto: star when "
     "some host runs more ranks than it has CPUs, else log.",
     true},
    {"bootstrap.secret_file", Type::String, "", "",
     "File holding the job secret used to authenticate bootstrap connections. Used when the "
     "launcher provides no STRATA_SECRET. It should be readable by its owner only (chmod 600): "
     "when its group or other users can read or write it, strata logs a warning naming the "
     "file.",
     false},
    {"bootstrap.max_message", Type::Bytes, "1G", "",
     "Largest message or record accepted from a peer; anything larger is a protocol error. Every "
     "rank must use the same limit.",
     true},
    {"bootstrap.tcp.root", Type::String, "", "",
     "host:port of rank 0's rendezvous listener. Empty means STRATA_ROOT from the launcher.",
     false},
    {"bootstrap.tcp.port", Type::Int, "0", "0..65535",
     "Port that rank 0's rendezvous listener binds under srun when --resv-ports is not used. 0 "
     "means no fixed port.",
     false},
    {"bootstrap.tcp.interface", Type::String, "", "",
     "Network interfaces the TCP bootstrap may use, in NCCL_SOCKET_IFNAME grammar: a comma list "
     "of name prefixes (eth,ib), ^ to exclude (^docker), = for exact names (=eth0). Empty picks "
     "one automatically.",
     false},
    {"bootstrap.tcp.family", Type::Enum, "auto", "auto|ipv4|ipv6",
     "Address family of the TCP bootstrap. auto takes the first address of the chosen "
     "interface.",
     false},
    {"transport.intra_node", Type::String, "nvlink,shm,fabric", "",
     "Comma-separated transports tried in order between ranks on one host; the first that both "
     "ranks can use connects them.",
     true},
    {"transport.inter_node", Type::String, "fabric", "",
     "Comma-separated transports tried in order between ranks on different hosts.", true},
    {"transport.timeout", Type::Double, "30", "0..",
     "Deadline in seconds of blocking transport calls (flush, semaphore waits; connection set-up "
     "uses bootstrap.timeout). 0 means no deadline.",
     false},
    {"transport.host_id", Type::String, "", "",
     "Host identity used to decide which ranks share a host. Empty means the host name plus the "
     "kernel boot id.",
     false},
    {"transport.fabric.provider", Type::String, "auto", "",
     "libfabric provider of the fabric transport, as fi_info names it (\"tcp;ofi_rxm\", "
     "\"shm\"). auto prefers verbs;ofi_rxm, then efa, then tcp;ofi_rxm.",
     true},
    {"transport.fabric.nic", Type::String, "auto", "",
     "NIC the fabric transport opens for each local rank when the ranks span hosts "
     "(docs/topology.md; strata-info --topology shows the choice): auto takes the nearest NIC "
     "in the topology (its GPU's, else its NUMA node's; ranks spread over equally near ones), "
     "or the provider's first domain when it offers none of them (tcp on veth or lo: "
     "unchanged); names in NCCL_IB_HCA's grammar restrict the choice (mlx5_0,mlx5_1 prefixes, "
     "=mlx5_0 exact, ^mlx5_2 excluded, :port ignored); LOCAL_RANK=NAME pairs map ranks "
     "(0=mlx5_0,1=mlx5_1). Named NICs are required: a provider without the chosen one fails.",
     false},
    {"transport.cuda.device", Type::Int, "-1", "-1..1023",
     "CUDA device index (as this process numbers them, through CUDA_VISIBLE_DEVICES) of the "
     "GPU this rank works with, for placement (docs/topology.md: its nearest NIC and cores). "
     "-1 takes the local rank, as a program that calls cudaSetDevice(LOCAL_RANK) does. strata "
     "does not set the device with it: the CUDA collectives use the caller's current device.",
     false},
    {"transport.proxy_cpus", Type::String, "auto", "",
     "CPUs of the proxy thread (PortChannels) and the fabric transport's progress thread "
     "(docs/topology.md): auto binds them to the cores near this rank's NIC when the ranks span "
     "hosts and those are not all of the machine's; none leaves them where the process runs; a "
     "CPU list (0-3,8) binds them there. CPUs outside the process's own mask are left out (a "
     "list with none inside binds nothing, with a warning).",
     false},
    {"topology.file", Type::String, "", "",
     "hwloc XML file (lstopo --of xml) to take as this machine's topology instead of reading "
     "it; empty reads the machine.",
     false},
    {"transport.fabric.probe_timeout", Type::Double, "5", "0..",
     "Seconds a peer may go without completing any write (data, or the 8-byte liveness write "
     "that waits send every 100 ms) while a liveness write is pending, before the fabric "
     "transport reports the peer lost. 0 turns the probe deadline off.",
     false},
    {"collectives.buffer_bytes", Type::Int, "8388608", "65536..",
     "Bytes of the receive buffer each rank shares with its peers for host collectives: one "
     "region of pipeline slots per peer (4 slots each while that leaves chunks of 64 KiB, else "
     "2). The chunk is at most collectives.chunk_bytes and shrinks with more peers: with the "
     "default 1 MiB at 2 ranks, 512 KiB at 4, 256 KiB at 8.",
     true},
    {"collectives.chunk_bytes", Type::Int, "1048576", "4096..",
     "Largest piece of a host collective sent in one step (pipelining unit). When the ranks span "
     "several hosts and this key is not set, 262144 (smaller pieces overlap the network with "
     "the copies).",
     true},
    {"collectives.algorithm", Type::String, "auto", "",
     "Algorithm forced for every operation that has one of this name (others choose "
     "automatically); auto lets each call choose (docs/collectives.md: the backends' algorithms "
     "in order, the first that accepts the call and prefers its size). Host algorithms: "
     "oneshot, twoshot, hierarchical (allReduce), singlecopy (allReduce, allGather, "
     "reduceScatter, broadcast, allToAll), direct (all but allReduce); strata-info "
     "--algorithms lists every loaded backend's. A name no backend has is an error at create; "
     "one that cannot serve a call (singlecopy across hosts) fails that call with NotSupported.",
     true},
    {"collectives.allreduce.algorithm", Type::String, "", "",
     "Algorithm forced for allReduce (overrides collectives.algorithm; empty: that key). A name "
     "that is not an allReduce algorithm is an error at create.",
     true},
    {"collectives.allgather.algorithm", Type::String, "", "",
     "Algorithm forced for allGather (overrides collectives.algorithm; empty: that key).", true},
    {"collectives.reducescatter.algorithm", Type::String, "", "",
     "Algorithm forced for reduceScatter (overrides collectives.algorithm; empty: that key).",
     true},
    {"collectives.broadcast.algorithm", Type::String, "", "",
     "Algorithm forced for broadcast (overrides collectives.algorithm; empty: that key).", true},
    {"collectives.alltoall.algorithm", Type::String, "", "",
     "Algorithm forced for allToAll (overrides collectives.algorithm; empty: that key).", true},
    {"collectives.sendrecv.algorithm", Type::String, "", "",
     "Algorithm forced for send, recv and sendRecv batches (overrides collectives.algorithm; "
     "empty: that key).",
     true},
    {"collectives.modules", Type::String, "auto", "",
     "Collectives modules to load after the built-in host backend, comma-separated "
     "(strata-collectives-<name>.so on the module path), or auto: every one of the known "
     "modules (cuda) that is found and loads, silently skipping those that are not; none: no "
     "module. A module named here that does not load is an error at create.",
     true},
    {"collectives.single_copy", Type::Enum, "auto", "auto|off",
     "Host collectives between ranks of one host read each other's buffers directly "
     "(process_vm_readv, one copy) when every pair of the job allows it (same user, ptrace "
     "permitted). off always copies through the shared receive buffers (two copies).",
     true},
    {"collectives.single_copy_min_bytes", Type::Int, "16384", "0..",
     "Smallest allGather, reduceScatter, broadcast or allToAll (bytes per rank) that auto runs by "
     "single copy when collectives.tuning is off (or has no measurement); with tuning the "
     "measured crossover applies unless this key is set explicitly. Smaller calls go through the "
     "shared receive buffers.",
     true},
    {"collectives.net_path", Type::Enum, "direct", "direct|proxy",
     "How the host collectives write to ranks whose memory is not mapped (on other hosts, over "
     "the fabric transport): direct: the calling thread stages each chunk and posts the write "
     "and its signal itself, and drives the transport while it waits; proxy: it queues them for "
     "the proxy thread (one more thread per rank, as the device collectives use).",
     false},
    {"collectives.zero_copy", Type::Enum, "auto", "auto|off",
     "Calls whose buffers are Communicator::allocHost memory on every rank read the peers' "
     "buffers through shared mappings (plain loads, no kernel copy) when every rank of the job is "
     "on one host and can map the others' memory (same user; /proc/<pid>/fd readable). off: "
     "such buffers are treated as any other memory.",
     true},
    {"collectives.revoke_on_error", Type::Bool, "true", "",
     "A rank whose collective fails with PeerLost, or with a Timeout the watch diagnosed, revokes "
     "the communicator (Communicator::revoke) so that the other ranks' calls fail at once with "
     "Aborted naming it and the cause, instead of each waiting for its own timeout "
     "(docs/fault-tolerance.md).",
     false},
    {"collectives.zero_copy_min_bytes", Type::Bytes, "256K", "",
     "Smallest call (bytes per rank) of allReduce, allGather, reduceScatter, broadcast and "
     "allToAll that auto gives to the zerocopy algorithm: it first exchanges buffer descriptors "
     "(one message round), then reads the peers' buffers directly when all are allocHost "
     "memory, and otherwise runs what auto would have chosen, one round later. Lower it when "
     "most large calls use allocHost buffers.",
     true},
    {"collectives.stream_copy", Type::Enum, "auto", "auto|always|off",
     "How the host collectives copy into a call's destination: auto streams (non-temporal "
     "stores, which skip reading the destination into the cache) when the call's send plus "
     "receive buffers reach this rank's share of the last-level cache (its size from sysfs, "
     "divided by the ranks on the host), and copies through the cache below; always streams "
     "every copy; off never does. A local choice: ranks may differ. strata-info --tuning shows "
     "the cache and the threshold.",
     false},
    {"collectives.tuning", Type::Enum, "auto", "auto|cached|off",
     "How the host collectives choose between the shared receive buffers and single copy: auto "
     "measures at create (rank 0 reads a same-host peer's memory both ways, a few ms) unless "
     "the cache ($XDG_CACHE_HOME/strata/host-tuning.txt) has this machine, then stores the "
     "figures there; cached uses the cache and never measures (the defaults when it has no "
     "entry); off uses collectives.single_copy_min_bytes and never single copy for allReduce. "
     "Forcing keys (collectives.algorithm) and an explicitly set single_copy_min_bytes win. "
     "strata-info --tuning shows the figures and choices.",
     true},
    {"collectives.measure_calls", Type::Int, "8", "0..64",
     "Calls of each way that auto times per size class before it chooses between single copy "
     "and the shared receive buffers for a call of 16 KiB to 4 MiB per rank on one host: the "
     "first calls of each op and power-of-two size run one way, the next ones the other, then "
     "the ranks add up their median times and every rank takes the faster (classes from 256 KiB take half as many per "
     "doubling, at least 2). It sees what the probe at create cannot: how the job's own buffers "
     "sit in the caches. 0: never; the crossovers of collectives.tuning decide, as they do when "
     "tuning is off or single_copy_min_bytes is set, and, at the default of 8, when the ranks "
     "of the host outnumber its CPUs (a few calls do not show how the scheduler will interleave "
     "them; another value measures there too). strata-info --tuning and the info log show the "
     "decisions.",
     true},
    {"collectives.oneshot_max_bytes", Type::Int, "262144", "0..",
     "Largest allReduce (bytes per rank) that auto runs with the oneshot algorithm at 2 ranks; "
     "at N > 2 ranks the limit is this times (2/N)^2, and when every rank is on one host whose "
     "CPUs they outnumber (the union of their affinities), times (cores/N)^2 more (64 KiB at 4 "
     "ranks on 4 or more CPUs, 16 KiB at 4 ranks on 2, with the default).",
     true},
    {"collectives.cuda.oneshot_max_bytes", Type::Bytes, "16K", "",
     "CUDA module (every rank must use the same collectives.cuda.* values: the module checks at "
     "create): largest allReduce (bytes per rank) that auto runs with oneshot-ll8 (all pairs, "
     "LL8 packets, one hop). 16 KiB is MSCCL++'s Hopper selector for 8 GPUs on NVSwitch "
     "(docs/collectives-cuda.md); not measured by strata yet.",
     false},
    {"collectives.cuda.twoshot_max_bytes", Type::Bytes, "2M", "",
     "CUDA module: largest allReduce that auto runs with twoshot-ll16 (LL16 packets, reduce-"
     "scatter + all-gather); above it, direct. 2 MiB is MSCCL++'s Hopper limit without NVLS. "
     "Also sizes the packet scratch (about 4x this, twice for the parity double buffer).",
     false},
    {"collectives.cuda.packets_max_bytes", Type::Bytes, "64K", "",
     "CUDA module: largest allGather, broadcast, allToAll (bytes per rank and peer) and "
     "reduceScatter (bytes per rank) that auto runs with LL packets; above it, direct.",
     false},
    {"collectives.cuda.staging_bytes", Type::Bytes, "8M", "",
     "CUDA module: bytes of each rank's staging area, the chunk the direct algorithms pipeline "
     "through (peers read it with 16-byte loads).",
     false},
    {"collectives.cuda.net_chunk_bytes", Type::Bytes, "512K", "",
     "CUDA module, ranks on several hosts: bytes of each bounce slot of the network step (a rank "
     "pins 4 x hosts x this in host memory, and 4 x this more per send/recv peer of another host "
     "and local index); a multiple of 16 (docs/collectives-cuda.md).",
     false},
    {"collectives.cuda.wait_limit", Type::Double, "600", "0..",
     "CUDA module: seconds a kernel waits for a peer that makes no progress before it gives up "
     "and the communicator reports Timeout naming that peer (0: never). Not transport.timeout: a "
     "rank may reach a call minutes after its peers (checkpointing, a slow data loader) and "
     "that is not an error, as with NCCL. A peer whose process exits is found by the host "
     "within about 0.1 s and stops the waits at once (PeerLost); so does destroying or aborting "
     "the communicator.",
     false},
    {"collectives.cuda.max_blocks", Type::Int, "32", "1..32",
     "CUDA module: most thread blocks a collective kernel launches (each block has its own flags "
     "and semaphores and works independently; a call takes fewer when it has less work). 32 is "
     "within MSCCL++'s and NCCL's usual 32-64 channels on 8 GPUs; not measured by strata yet.",
     false},
    {"collectives.cuda.threads", Type::Int, "512", "32..512",
     "CUDA module: threads per block of the collective kernels (the kernels are compiled for at "
     "most 512).",
     false},
    {"watch.enabled", Type::Bool, "true", "",
     "Run the status service (one thread per process while a bootstrap of two or more ranks "
     "exists): a rank whose call times out asks the others what they are doing and names the "
     "rank at fault first, and strata-info --job can ask a live job (docs/errors.md, \"When a "
     "job stalls\").",
     false},
    {"watch.query_timeout", Type::Double, "1", "0.05..60",
     "Seconds a rank whose call failed waits for the other ranks' answers before it reports the "
     "error (a stopped rank never answers). The error comes this much after the timeout.",
     false},

};
// END KEYS

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  return text;
}

[[noreturn]] void invalid(const KeyInfo& key, std::string_view value, std::string_view where,
                          std::string_view why) {
  throw Error(ErrorCode::InvalidConfig,
              fmt::format("{}: invalid value '{}' for configuration key '{}': {}", where, value,
                          key.key, why));
}

// Range text "min..max" from the choices field; either side may be empty.
struct Range {
  std::string_view min;
  std::string_view max;
};

std::optional<Range> parseRange(std::string_view choices) {
  auto dots = choices.find("..");
  if (dots == std::string_view::npos) return std::nullopt;
  return Range{choices.substr(0, dots), choices.substr(dots + 2)};
}

// A decimal integer (T = int64_t) or number (T = double), with an optional leading '+'.
template <typename T>
std::optional<T> parseNumber(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  T value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}
constexpr auto parseInt = parseNumber<int64_t>;
constexpr auto parseDouble = parseNumber<double>;

// Rejects a number outside the key's range "min..max" (either side may be empty).
template <typename T>
void checkRange(const KeyInfo& key, std::string_view value, std::string_view where, T number) {
  auto range = parseRange(key.choices);
  if (!range) return;
  if (!range->min.empty() && number < parseNumber<T>(range->min).value_or(0)) {
    invalid(key, value, where, fmt::format("must be at least {}", range->min));
  }
  if (!range->max.empty() && number > parseNumber<T>(range->max).value_or(0)) {
    invalid(key, value, where, fmt::format("must be at most {}", range->max));
  }
}

std::optional<bool> parseBool(std::string_view text) {
  std::string t = lower(text);
  if (t == "true" || t == "1" || t == "yes" || t == "on") return true;
  if (t == "false" || t == "0" || t == "no" || t == "off") return false;
  return std::nullopt;
}

// "64M", "1G", "1GiB", "512B", "4096": powers of 1024. nullopt when malformed or too large.
std::optional<uint64_t> parseBytes(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0) return std::nullopt;
  uint64_t number = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + digits, number);
  if (ec != std::errc() || end != text.data() + digits) return std::nullopt;
  std::string suffix = lower(trim(text.substr(digits)));
  // k, m, g, t: 2^10, 2^20, 2^30, 2^40.
  const size_t unit =
      suffix.empty() ? std::string_view::npos : std::string_view("kmgt").find(suffix[0]);
  const int shift = unit == std::string_view::npos ? 0 : 10 * static_cast<int>(unit + 1);
  std::string_view rest = suffix;
  if (shift != 0) rest.remove_prefix(1);
  // After a multiplier "B" and "iB" are both accepted; a bare number may end in "B" only.
  if (!(rest.empty() || rest == "b" || (shift != 0 && rest == "ib"))) return std::nullopt;
  if (shift != 0 && number > (std::numeric_limits<uint64_t>::max() >> shift)) return std::nullopt;
  return number << shift;
}

const KeyInfo& require(std::string_view key) {
  const KeyInfo* info = find(key);
  if (info == nullptr) {
    throw Error(ErrorCode::Internal,
                fmt::format("configuration key '{}' is not declared in config_keys.cpp", key));
  }
  return *info;
}

/// The validated text of a key read as `wanted` (one of `types`); throws Internal when the key is
/// declared with another type and InvalidConfig when it has no value.
std::string validated(const Config& config, std::string_view key, std::string_view wanted,
                      std::initializer_list<Type> types) {
  const KeyInfo& info = require(key);
  if (std::find(types.begin(), types.end(), info.type) == types.end()) {
    throw Error(ErrorCode::Internal,
                fmt::format("configuration key '{}' was read as {} but is declared otherwise",
                            info.key, wanted));
  }
  auto text = config.get(key);
  if (!text) {
    throw Error(ErrorCode::InvalidConfig,
                fmt::format("configuration key '{}' has no value; set it in strata.toml or {}", key,
                            envName(key)));
  }
  return validate(info, *text, source(config, key));
}

}  // namespace

std::span<const KeyInfo> keys() {
  return kKeys;
}

const KeyInfo* find(std::string_view key) {
  for (const KeyInfo& info : kKeys) {
    if (info.key == key) return &info;
  }
  return nullptr;
}

std::string envName(std::string_view key) {
  std::string name = "STRATA_";
  for (char c : key) {
    name += c == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return name;
}

std::string validate(const KeyInfo& key, std::string_view value, std::string_view where) {
  std::string_view text = key.type == Type::String ? value : trim(value);
  switch (key.type) {
    case Type::String:
      if (text.find('\0') != std::string_view::npos) invalid(key, value, where, "contains a NUL");
      return std::string(text);

    case Type::Int: {
      auto number = parseInt(text);
      if (!number) invalid(key, value, where, "expected a decimal integer");
      checkRange(key, value, where, *number);
      return std::to_string(*number);
    }

    case Type::Double: {
      auto number = parseDouble(text);
      if (!number) invalid(key, value, where, "expected a number");
      if (!std::isfinite(*number)) invalid(key, value, where, "must be finite");
      checkRange(key, value, where, *number);
      // Shortest text that round-trips, so that equal values compare equal in the agreement check.
      return fmt::format("{}", *number);
    }

    case Type::Bool: {
      auto flag = parseBool(text);
      if (!flag) invalid(key, value, where, "expected true/false, 1/0, yes/no or on/off");
      return *flag ? "true" : "false";
    }

    case Type::Enum: {
      std::string wanted = lower(text);
      std::string_view choices = key.choices;
      while (!choices.empty()) {
        auto bar = choices.find('|');
        std::string_view choice = choices.substr(0, bar);
        if (choice == wanted) return std::string(choice);
        if (bar == std::string_view::npos) break;
        choices.remove_prefix(bar + 1);
      }
      invalid(key, value, where, fmt::format("expected one of {}", key.choices));
    }

    case Type::Bytes: {
      auto bytes = parseBytes(text);
      if (!bytes) {
        invalid(key, value, where,
                "expected a byte count such as 4096, 64K, 64M or 1G (powers of 1024)");
      }
      // Canonical as a plain byte count so that "1G" and "1024M" agree between ranks.
      return std::to_string(*bytes);
    }
  }
  throw Error(ErrorCode::Internal, fmt::format("configuration key '{}' has no type", key.key));
}

std::string getString(const Config& config, std::string_view key) {
  require(key);
  return config.get(key).value_or("");
}

int64_t getInt(const Config& config, std::string_view key) {
  return std::stoll(validated(config, key, "an integer", {Type::Int}));
}

double getDouble(const Config& config, std::string_view key) {
  return parseDouble(validated(config, key, "a number", {Type::Double, Type::Int})).value_or(0);
}

bool getBool(const Config& config, std::string_view key) {
  // An unset boolean reads as false; any other unset key is an error.
  if (!config.get(key) && require(key).type == Type::Bool) return false;
  return validated(config, key, "a boolean", {Type::Bool}) == "true";
}

uint64_t getBytes(const Config& config, std::string_view key) {
  std::string canonical = validated(config, key, "a byte count", {Type::Bytes, Type::Int});
  if (canonical.front() == '-') {
    throw Error(ErrorCode::InvalidConfig,
                fmt::format("{}: configuration key '{}' must not be negative here (got {})",
                            source(config, key), key, canonical));
  }
  return std::stoull(canonical);
}

}  // namespace strata::config
