#include "environment.hpp"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <optional>
#include <string_view>

#include "io.hpp"
#include "root_socket.hpp"

extern char** environ;

namespace strata::run {
namespace {

// Variables of the launcher contract; inherited values are dropped so that a job started from
// inside another job (or a shell that exported them) cannot mix two contracts.
constexpr std::string_view kContractVars[] = {
    "STRATA_RANK", "STRATA_SIZE",   "STRATA_LOCAL_RANK", "STRATA_LOCAL_SIZE",
    "STRATA_ROOT", "STRATA_SECRET", "STRATA_ROOT_FD",
};

// --torch: the variables torch.distributed's env:// init method reads. With --torch, inherited
// values are dropped like the contract's; --env values win over the generated ones.
constexpr std::string_view kTorchVars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
};

// The last --env value of `key`, if any.
std::optional<std::string> envOption(const Options& options, std::string_view key) {
  std::optional<std::string> value;
  for (const auto& [k, v] : options.env) {
    if (k == key) value = v;
  }
  return value;
}

}  // namespace

// The job secret: 32 random bytes as 64 lowercase hex characters.
bool Environment::makeSecret(std::string& error) {
  Fd fd(::open("/dev/urandom", O_RDONLY | O_CLOEXEC));
  if (!fd) {
    error = "cannot open /dev/urandom for the job secret: " + errnoText(errno);
    return false;
  }
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = ::read(fd.get(), bytes + got, sizeof(bytes) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = "cannot read /dev/urandom for the job secret: " +
              (n < 0 ? errnoText(errno) : std::string("unexpected end of file"));
      return false;
    }
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  secret_.clear();
  for (unsigned char b : bytes) {
    secret_ += kHex[b >> 4];
    secret_ += kHex[b & 15];
  }
  return true;
}

bool Environment::chooseTorchMaster(int rootPort) {
  auto addr = envOption(options_, "MASTER_ADDR");
  auto port = envOption(options_, "MASTER_PORT");
  masterAddr_ = addr.value_or(options_.rootHost);
  if (port) {
    masterPort_ = *port;
  } else {
    int picked = 0;
    std::string error;
    if (!pickFreePort(masterAddr_, rootPort, picked, masterPortHold_, error)) {
      say(error);
      return false;
    }
    masterPort_ = std::to_string(picked);
  }
  if (options_.verbose) {
    bool v6 = masterAddr_.find(':') != std::string::npos;
    say("--torch: MASTER_ADDR:MASTER_PORT " + (v6 ? "[" + masterAddr_ + "]" : masterAddr_) + ":" +
        masterPort_ + (addr || port ? " (with --env values)" : ""));
  }
  return true;
}

void Environment::buildBase() {
  auto keyOf = [](std::string_view entry) { return entry.substr(0, entry.find('=')); };
  auto isContract = [](std::string_view key) {
    return std::find(std::begin(kContractVars), std::end(kContractVars), key) !=
           std::end(kContractVars);
  };
  auto isTorch = [this](std::string_view key) {
    return options_.torch &&
           std::find(std::begin(kTorchVars), std::end(kTorchVars), key) != std::end(kTorchVars);
  };
  for (char** e = environ; *e; ++e) {
    std::string_view entry(*e);
    std::string_view key = keyOf(entry);
    if (isContract(key) || isTorch(key)) {
      if (options_.verbose) {
        bool byEnvOption = isTorch(key) && envOption(options_, key);
        // A secret is never printed, not even the one being replaced (a nested launch's).
        std::string shown =
            key == "STRATA_SECRET" ? std::string(key) + "=(hidden)" : std::string(entry);
        say("warning: overriding " + shown + " from the environment with " +
            (byEnvOption ? "the --env value" : "strata-run's own value"));
      }
      continue;
    }
    base_.emplace_back(entry);
  }
  for (const auto& [key, value] : options_.env) {
    if (isContract(key)) {
      say("warning: ignoring --env " + key + "=...: strata-run sets " + key + " itself");
      continue;
    }
    std::erase_if(base_, [&, &k = key](const std::string& e) { return keyOf(e) == k; });
    base_.push_back(key + "=" + value);
  }
}

std::vector<std::string> Environment::forRank(int r, const std::string& rootAddress,
                                              int rootFd) const {
  std::vector<std::string> envStrings = base_;
  envStrings.push_back("STRATA_RANK=" + std::to_string(r));
  envStrings.push_back("STRATA_SIZE=" + std::to_string(options_.np));
  envStrings.push_back("STRATA_LOCAL_RANK=" + std::to_string(r));
  envStrings.push_back("STRATA_LOCAL_SIZE=" + std::to_string(options_.np));
  envStrings.push_back("STRATA_ROOT=" + rootAddress);
  envStrings.push_back("STRATA_SECRET=" + secret_);
  if (r == 0) envStrings.push_back("STRATA_ROOT_FD=" + std::to_string(rootFd));
  if (options_.torch) {
    // --env values are in base_ already and win; inherited ones were dropped.
    const std::string values[] = {std::to_string(r), std::to_string(options_.np),
                                  std::to_string(r), std::to_string(options_.np),
                                  masterAddr_,       masterPort_};
    static_assert(std::size(values) == std::size(kTorchVars));
    for (size_t i = 0; i < std::size(kTorchVars); ++i) {
      if (!envOption(options_, kTorchVars[i])) {
        envStrings.push_back(std::string(kTorchVars[i]) + "=" + values[i]);
      }
    }
  }
  return envStrings;
}

}  // namespace strata::run
