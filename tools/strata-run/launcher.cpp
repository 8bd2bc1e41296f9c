#include "launcher.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

extern char** environ;

namespace strata::run {
namespace {

using Clock = std::chrono::steady_clock;

// Signals strata-run passes on to every rank.
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

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

// A rank's partial line is held back until its newline arrives, but not without bound: a stream
// with no newlines at all (binary output) is cut into lines of this size.
constexpr size_t kMaxPendingLine = 1 << 20;
constexpr size_t kReadChunk = 64 * 1024;

bool writeAll(int fd, std::string_view data) noexcept {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;  // EPIPE and friends: the reader is gone, drop the output
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// One write() per message, so that our own lines never interleave with relayed rank lines.
void say(const std::string& message) noexcept {
  try {
    writeAll(STDERR_FILENO, "strata-run: " + message + "\n");
  } catch (...) {
  }
}

std::string errnoText(int err) {
  return std::strerror(err);
}

std::string signalName(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string formatSeconds(double s) {
  std::string text = std::to_string(s);
  // std::to_string gives "3.000000"; trim the zeros for messages.
  while (!text.empty() && text.back() == '0') text.pop_back();
  if (!text.empty() && text.back() == '.') text.pop_back();
  return text + " s";
}

// "0-3,5,7-8" for a sorted list of ranks.
std::string rankRanges(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(ranks[i]);
    if (j > i) out += '-' + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

// A rank's wait status as strata-run's exit status: the exit code, or 128 + signal like a shell.
int exitStatusOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describeStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    std::string text = "killed by signal " + std::to_string(sig) + " (" + signalName(sig) + ")";
    if (WCOREDUMP(status)) text += " (core dumped)";
    return text;
  }
  return "ended with wait status " + std::to_string(status);
}

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// The job secret: 32 random bytes as 64 lowercase hex characters.
bool makeSecret(std::string& secret, std::string& error) {
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
  secret.clear();
  for (unsigned char b : bytes) {
    secret += kHex[b >> 4];
    secret += kHex[b & 15];
  }
  return true;
}

// A TCP socket bound to the first address of host:port that works.
struct BoundSocket {
  Fd fd;
  std::string host;  ///< numeric
  int port = 0;
  bool v6 = false;
};

// Resolves host, then binds (and with backlog > 0 listens, with SO_REUSEADDR) the first address
// that works. Returns "" on success, else why not; `unresolved` tells a name that did not
// resolve (the text is gai_strerror's) from a socket call that failed.
std::string bindFirst(const std::string& host, int port, int backlog, BoundSocket& out,
                      bool& unresolved) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
  addrinfo* results = nullptr;
  unresolved = false;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &results);
  if (rc != 0) {
    unresolved = true;
    return ::gai_strerror(rc);
  }
  std::string lastError = "no address";
  for (addrinfo* ai = results; ai; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd) {
      lastError = "socket: " + errnoText(errno);
      continue;
    }
    if (backlog > 0) {
      int one = 1;
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    }
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      lastError = "bind: " + errnoText(errno);
      continue;
    }
    if (backlog > 0 && ::listen(fd.get(), backlog) != 0) {
      lastError = "listen: " + errnoText(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    char numericHost[NI_MAXHOST];
    char serv[NI_MAXSERV];
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0 ||
        ::getnameinfo(reinterpret_cast<sockaddr*>(&bound), len, numericHost, sizeof(numericHost),
                      serv, sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
      lastError = "getsockname: " + errnoText(errno);
      continue;
    }
    out.fd = std::move(fd);
    out.host = numericHost;
    out.port = std::atoi(serv);
    out.v6 = bound.ss_family == AF_INET6;
    ::freeaddrinfo(results);
    return "";
  }
  ::freeaddrinfo(results);
  return lastError;
}

// The root listener is created here and handed to rank 0 as an open fd instead of passing rank 0
// a port number to bind: binding, closing and re-binding a port races with other processes
// (MSCCL++ issue #163), an inherited listening socket cannot.
bool openRootSocket(const Options& options, Fd& listener, std::string& address, int& boundPort,
                    std::string& error) {
  BoundSocket b;
  bool unresolved = false;
  std::string why =
      bindFirst(options.rootHost, options.rootPort, std::max(SOMAXCONN, options.np), b, unresolved);
  if (unresolved) {
    error = "cannot resolve --root-host '" + options.rootHost + "': " + why +
            "; give a numeric address such as 127.0.0.1 or ::1";
    return false;
  }
  if (!why.empty()) {
    error = "cannot open the root listener on " + options.rootHost + " port " +
            std::to_string(options.rootPort) + " (" + why + ")";
    if (options.rootPort != 0) {
      error += "; choose another --root-port, or omit it to get a free one";
    }
    return false;
  }
  // The same notation the library parses: "a.b.c.d:port" or "[v6]:port".
  const std::string port = std::to_string(b.port);
  address = b.v6 ? "[" + b.host + "]:" + port : b.host + ":" + port;
  boundPort = b.port;
  listener = std::move(b.fd);
  return true;
}

// --torch: a free TCP port on `host` for MASTER_PORT. torch's rank 0 binds it itself (env://
// cannot adopt an inherited listener), so this is bind port 0, read the port back, close: another
// process could take the port before torch binds it, unlike the root listener. `avoid` (the root
// port) is still bound while this runs, so the kernel does not hand it out; a probe that gets it
// anyway stays open until the end, so that the next one gets another port.
bool pickFreePort(const std::string& host, int avoid, int& port, std::string& error) {
  std::vector<Fd> held;
  std::string lastError = "no address";
  for (int attempt = 0; attempt < 8; ++attempt) {
    BoundSocket b;
    bool unresolved = false;
    std::string why = bindFirst(host, 0, 0, b, unresolved);
    if (unresolved) {
      error = "--torch: cannot resolve MASTER_ADDR '" + host + "': " + why;
      return false;
    }
    if (!why.empty()) {
      lastError = why;
      break;  // every address failed: retrying will not help
    }
    if (b.port <= 0 || b.port > 65535 || b.port == avoid) {
      lastError = "got port " + std::to_string(b.port);
      held.push_back(std::move(b.fd));  // try again while this one is held
      continue;
    }
    port = b.port;
    return true;  // b.fd closes here: the port is free for torch's rank 0
  }
  error = "--torch: cannot find a free port for MASTER_PORT on " + host + " (" + lastError +
          "); give one with --env MASTER_PORT=P";
  return false;
}

// One relayed output stream of one rank (--tag-output).
struct Stream {
  Fd fd;
  int target = STDOUT_FILENO;
  std::string pending;  // the incomplete last line
};

struct Rank {
  int index = 0;
  pid_t pid = -1;
  bool running = false;
  Stream out;
  Stream err;
};

class Job {
 public:
  explicit Job(const Options& options) : options_(options) {}
  int run();

 private:
  enum class Phase { Running, Grace, Term, Kill };

  bool setUp();
  bool setUpTorch();
  void buildBaseEnvironment();
  // Starts rank r; on failure sets launchStatus_ and returns false.
  bool launch(int r);
  [[noreturn]] void execChild(int r, int stdinFd, int outFd, int errFd, int execErrFd,
                              char* const* argv, char* const* envp);
  void loop();
  void handleSignals();
  void reap();
  void rankEnded(Rank& rank, int status);
  void startTeardown(Phase phase);
  void signalRanks(int sig);
  void checkDeadlines();
  void readStream(Rank& rank, Stream& stream, bool drain);
  void emitLines(int rankIndex, Stream& stream, bool final);
  std::vector<int> runningRanks() const;

  const Options& options_;
  std::vector<Rank> ranks_;
  std::unordered_map<pid_t, int> byPid_;
  int running_ = 0;

  std::string secret_;
  std::string rootAddress_;
  int rootPort_ = 0;
  std::string masterAddr_;  ///< --torch: MASTER_ADDR and MASTER_PORT as the ranks get them
  std::string masterPort_;
  Fd listener_;
  Fd signalFd_;
  Fd devNull_;
  sigset_t oldMask_{};
  rlimit oldNoFile_{};
  bool raisedNoFile_ = false;
  std::vector<std::string> baseEnv_;
  pid_t self_ = 0;
  std::vector<int> cpus_;  ///< --bind-to core: the CPUs strata-run may use, in order

  Phase phase_ = Phase::Running;
  Clock::time_point phaseDeadline_{};
  std::optional<Clock::time_point> timeoutDeadline_;
  std::optional<int> exitStatus_;  // decided by the first failure, timeout or launch error
  int launchStatus_ = 0;
  bool interrupted_ = false;  // a terminating signal was forwarded
};

bool Job::setUp() {
  self_ = ::getpid();
  if (options_.bindToCore) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) != 0) {
      say("--bind-to core: cannot read this process's CPU set: " + errnoText(errno));
      return false;
    }
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus_.push_back(c);
    }
    if (options_.verbose) {
      say("--bind-to core: " + std::to_string(options_.np) + " ranks round-robin over " +
          std::to_string(cpus_.size()) + " CPUs");
    }
  }
  // The fds the ranks get must not land on 0-2, and a rank must not find 0-2 closed.
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1) {
      int opened = ::open("/dev/null", O_RDWR);
      if (opened != fd) {
        say("cannot open /dev/null for a closed standard stream: " + errnoText(errno));
        return false;
      }
    }
  }
  devNull_ = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!devNull_) {
    say("cannot open /dev/null: " + errnoText(errno));
    return false;
  }

  // Relaying output holds two pipes per rank; 4096 ranks need more than the usual soft limit.
  if (::getrlimit(RLIMIT_NOFILE, &oldNoFile_) == 0 && oldNoFile_.rlim_cur < oldNoFile_.rlim_max) {
    rlimit raised = oldNoFile_;
    raised.rlim_cur = oldNoFile_.rlim_max;
    raisedNoFile_ = ::setrlimit(RLIMIT_NOFILE, &raised) == 0;
  }

  std::string error;
  if (!makeSecret(secret_, error) ||
      !openRootSocket(options_, listener_, rootAddress_, rootPort_, error)) {
    say(error);
    return false;
  }
  if (options_.torch && !setUpTorch()) return false;

  if (options_.output == OutputMode::Directory) {
    std::error_code ec;
    std::filesystem::create_directories(options_.outputDir, ec);
    if (ec) {
      say("cannot create --output-dir '" + options_.outputDir + "': " + ec.message());
      return false;
    }
  }

  // Signals arrive through a signalfd read by the poll loop: no handler runs at an awkward time
  // and nothing is lost between polls. Children restore the old mask before exec.
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : kForwardedSignals) sigaddset(&mask, sig);
  sigaddset(&mask, SIGCHLD);
  if (::sigprocmask(SIG_BLOCK, &mask, &oldMask_) != 0) {
    say("cannot block signals: " + errnoText(errno));
    return false;
  }
  signalFd_ = Fd(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signalFd_) {
    say("cannot create a signalfd: " + errnoText(errno));
    return false;
  }
  // A closed stdout must not kill strata-run and orphan the job; children get SIGPIPE back.
  ::signal(SIGPIPE, SIG_IGN);

  if (options_.timeoutSeconds) {
    timeoutDeadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(*options_.timeoutSeconds));
  }
  buildBaseEnvironment();
  return true;
}

// The last --env value of `key`, if any.
std::optional<std::string> envOption(const Options& options, std::string_view key) {
  std::optional<std::string> value;
  for (const auto& [k, v] : options.env) {
    if (k == key) value = v;
  }
  return value;
}

// Chooses MASTER_ADDR and MASTER_PORT, unless --env gives them.
bool Job::setUpTorch() {
  auto addr = envOption(options_, "MASTER_ADDR");
  auto port = envOption(options_, "MASTER_PORT");
  masterAddr_ = addr.value_or(options_.rootHost);
  if (port) {
    masterPort_ = *port;
  } else {
    int picked = 0;
    std::string error;
    if (!pickFreePort(masterAddr_, rootPort_, picked, error)) {
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

void Job::buildBaseEnvironment() {
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
    baseEnv_.emplace_back(entry);
  }
  for (const auto& [key, value] : options_.env) {
    if (isContract(key)) {
      say("warning: ignoring --env " + key + "=...: strata-run sets " + key + " itself");
      continue;
    }
    std::erase_if(baseEnv_, [&, &k = key](const std::string& e) { return keyOf(e) == k; });
    baseEnv_.push_back(key + "=" + value);
  }
}

void Job::execChild(int r, int stdinFd, int outFd, int errFd, int execErrFd, char* const* argv,
                    char* const* envp) {
  // Own process group: signals to the group reach the rank's children too, and a Ctrl-C on the
  // terminal reaches strata-run only, which forwards it once.
  ::setpgid(0, 0);
  // Ranks must not outlive a strata-run that was killed without a chance to end them.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != self_) ::_exit(kExitNoExec);
  ::signal(SIGPIPE, SIG_DFL);
  ::sigprocmask(SIG_SETMASK, &oldMask_, nullptr);
  if (raisedNoFile_) ::setrlimit(RLIMIT_NOFILE, &oldNoFile_);
  if (!cpus_.empty()) {
    // Best effort: an error leaves the rank on strata-run's CPU set, which still runs it.
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus_[static_cast<size_t>(r) % cpus_.size()], &set);
    ::sched_setaffinity(0, sizeof set, &set);
  }
  if (stdinFd != STDIN_FILENO) ::dup2(stdinFd, STDIN_FILENO);
  if (outFd != STDOUT_FILENO) ::dup2(outFd, STDOUT_FILENO);
  if (errFd != STDERR_FILENO) ::dup2(errFd, STDERR_FILENO);
  if (r == 0) {
    // Only rank 0 keeps the listener across exec; it was created close-on-exec for the others.
    int flags = ::fcntl(listener_.get(), F_GETFD);
    ::fcntl(listener_.get(), F_SETFD, flags & ~FD_CLOEXEC);
  }
  ::execvpe(argv[0], argv, envp);
  int err = errno;
  (void)!::write(execErrFd, &err, sizeof(err));
  ::_exit(kExitNoExec);
}

bool Job::launch(int r) {
  Rank& rank = ranks_[r];
  rank.index = r;

  std::vector<std::string> envStrings = baseEnv_;
  envStrings.push_back("STRATA_RANK=" + std::to_string(r));
  envStrings.push_back("STRATA_SIZE=" + std::to_string(options_.np));
  envStrings.push_back("STRATA_LOCAL_RANK=" + std::to_string(r));
  envStrings.push_back("STRATA_LOCAL_SIZE=" + std::to_string(options_.np));
  envStrings.push_back("STRATA_ROOT=" + rootAddress_);
  envStrings.push_back("STRATA_SECRET=" + secret_);
  if (r == 0) envStrings.push_back("STRATA_ROOT_FD=" + std::to_string(listener_.get()));
  if (options_.torch) {
    // --env values are in baseEnv_ already and win; inherited ones were dropped.
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
  std::vector<char*> envp;
  for (auto& s : envStrings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argStrings = options_.command;
  std::vector<char*> argv;
  for (auto& s : argStrings) argv.push_back(s.data());
  argv.push_back(nullptr);

  Fd outWrite, errWrite;
  if (options_.output == OutputMode::Tag) {
    int p[2];
    for (Stream* stream : {&rank.out, &rank.err}) {
      if (::pipe2(p, O_CLOEXEC) != 0) {
        say("cannot create an output pipe for rank " + std::to_string(r) + ": " + errnoText(errno));
        launchStatus_ = kExitUsage;
        return false;
      }
      ::fcntl(p[0], F_SETFL, ::fcntl(p[0], F_GETFL) | O_NONBLOCK);
      stream->fd = Fd(p[0]);
      (stream == &rank.out ? outWrite : errWrite) = Fd(p[1]);
    }
    rank.out.target = STDOUT_FILENO;
    rank.err.target = STDERR_FILENO;
  } else if (options_.output == OutputMode::Directory) {
    for (const char* suffix : {".out", ".err"}) {
      auto path =
          std::filesystem::path(options_.outputDir) / ("rank-" + std::to_string(r) + suffix);
      Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666));
      if (!fd) {
        say("cannot create " + path.string() + ": " + errnoText(errno));
        launchStatus_ = kExitUsage;
        return false;
      }
      (std::string_view(suffix) == ".out" ? outWrite : errWrite) = std::move(fd);
    }
  }
  // Only rank 0 gets a piped or redirected stdin; a terminal stays with strata-run, because a
  // rank in its own process group that reads the terminal would be stopped by SIGTTIN.
  int stdinFd = (r == 0 && !::isatty(STDIN_FILENO)) ? STDIN_FILENO : devNull_.get();

  int execPipe[2];
  if (::pipe2(execPipe, O_CLOEXEC) != 0) {
    say("cannot create a pipe to start rank " + std::to_string(r) + ": " + errnoText(errno));
    launchStatus_ = kExitUsage;
    return false;
  }
  Fd execRead(execPipe[0]), execWrite(execPipe[1]);

  pid_t pid = ::fork();
  if (pid < 0) {
    say("cannot start rank " + std::to_string(r) + ": fork: " + errnoText(errno) +
        (errno == EAGAIN ? " (process limit reached; try a smaller -n)" : ""));
    launchStatus_ = kExitUsage;
    return false;
  }
  if (pid == 0) {
    execChild(r, stdinFd, outWrite ? outWrite.get() : STDOUT_FILENO,
              errWrite ? errWrite.get() : STDERR_FILENO, execWrite.get(), argv.data(), envp.data());
  }
  // Also from this side, so that a signal sent right after fork() already reaches the group.
  ::setpgid(pid, pid);
  rank.pid = pid;
  rank.running = true;
  byPid_[pid] = r;
  ++running_;
  if (r == 0) listener_.reset();  // rank 0 holds it now
  execWrite.reset();
  outWrite.reset();
  errWrite.reset();

  // The exec pipe closes on a successful exec, or carries errno from a failed one.
  int err = 0;
  ssize_t n;
  do {
    n = ::read(execRead.get(), &err, sizeof(err));
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(err))) {
    std::string hint;
    if (err == ENOENT) {
      hint = options_.command[0].find('/') == std::string::npos
                 ? " (not found in PATH; give a path such as ./" + options_.command[0] + ")"
                 : " (no such file)";
    } else if (err == EACCES) {
      hint = " (check that it is an executable file)";
    }
    say("cannot execute '" + options_.command[0] + "': " + errnoText(err) + hint);
    launchStatus_ = kExitNoExec;
    return false;
  }
  if (options_.verbose && r + 1 == options_.np) {
    say("started " + std::to_string(options_.np) + " rank(s) of '" + options_.command[0] +
        "', root " + rootAddress_);
  }
  return true;
}

std::vector<int> Job::runningRanks() const {
  std::vector<int> out;
  for (const Rank& rank : ranks_) {
    if (rank.running) out.push_back(rank.index);
  }
  return out;
}

void Job::signalRanks(int sig) {
  for (const Rank& rank : ranks_) {
    if (!rank.running) continue;
    // A rank that moved itself to another group is still reached directly.
    if (::kill(-rank.pid, sig) != 0 && errno == ESRCH) ::kill(rank.pid, sig);
  }
}

void Job::startTeardown(Phase phase) {
  phase_ = phase;
  auto grace = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.graceSeconds));
  phaseDeadline_ = Clock::now() + grace;
  if (phase == Phase::Term) {
    if (options_.verbose && running_ > 0) {
      say("sending SIGTERM to rank(s) " + rankRanges(runningRanks()));
    }
    signalRanks(SIGTERM);
  } else if (options_.verbose && running_ > 0) {
    say("waiting up to " + formatSeconds(options_.graceSeconds) + " for rank(s) " +
        rankRanges(runningRanks()) + " to finish");
  }
}

void Job::checkDeadlines() {
  auto now = Clock::now();
  if (phase_ == Phase::Running && timeoutDeadline_ && now >= *timeoutDeadline_) {
    say("timeout after " + formatSeconds(*options_.timeoutSeconds) +
        "; rank(s) still running: " + rankRanges(runningRanks()) + "; ending them");
    exitStatus_ = kExitTimeout;
    startTeardown(Phase::Term);
    return;
  }
  if (phase_ == Phase::Grace && now >= phaseDeadline_) {
    startTeardown(Phase::Term);
  } else if (phase_ == Phase::Term && now >= phaseDeadline_) {
    if (running_ > 0) {
      say("rank(s) " + rankRanges(runningRanks()) + " did not end on SIGTERM within " +
          formatSeconds(options_.graceSeconds) + "; sending SIGKILL");
    }
    signalRanks(SIGKILL);
    phase_ = Phase::Kill;
  }
}

void Job::rankEnded(Rank& rank, int status) {
  rank.running = false;
  --running_;
  bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (!failed) return;
  std::string line = "rank " + std::to_string(rank.index) + " (pid " + std::to_string(rank.pid) +
                     ") " + describeStatus(status);
  // Ranks that end because strata-run (or its user) signalled them are expected to fail; only
  // failures of their own are worth a line by default.
  bool ownFailure = !interrupted_ && (phase_ == Phase::Running || phase_ == Phase::Grace);
  if (ownFailure || options_.verbose) say(line);
  if (!exitStatus_) exitStatus_ = exitStatusOf(status);
  if (phase_ == Phase::Running) startTeardown(Phase::Grace);
}

void Job::reap() {
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;
    auto it = byPid_.find(pid);
    if (it == byPid_.end()) continue;
    rankEnded(ranks_[it->second], status);
    byPid_.erase(it);
  }
}

void Job::handleSignals() {
  signalfd_siginfo info;
  for (;;) {
    ssize_t n = ::read(signalFd_.get(), &info, sizeof(info));
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof(info))) return;
    int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) continue;  // reap() runs after every wake-up anyway
    if (options_.verbose) say("forwarding " + signalName(sig) + " to every rank");
    signalRanks(sig);
    // A terminating signal means the user wants the job gone: if the ranks catch it and carry
    // on, they still get the grace period, then SIGTERM and SIGKILL. USR1/USR2 only forward.
    if (sig != SIGUSR1 && sig != SIGUSR2) {
      interrupted_ = true;
      if (phase_ == Phase::Running) startTeardown(Phase::Grace);
    }
  }
}

void Job::emitLines(int rankIndex, Stream& stream, bool final) {
  const std::string prefix = "[" + std::to_string(rankIndex) + "] ";
  std::string out;
  size_t start = 0;
  for (;;) {
    size_t nl = stream.pending.find('\n', start);
    if (nl == std::string::npos) break;
    out += prefix;
    out.append(stream.pending, start, nl + 1 - start);
    start = nl + 1;
  }
  stream.pending.erase(0, start);
  if (!stream.pending.empty() && (final || stream.pending.size() >= kMaxPendingLine)) {
    out += prefix + stream.pending + '\n';
    stream.pending.clear();
  }
  // Whole lines in one write: a line from one rank is never split by another's.
  if (!out.empty()) writeAll(stream.target, out);
}

void Job::readStream(Rank& rank, Stream& stream, bool drain) {
  char buf[kReadChunk];
  // Outside the final drain one read per wake-up, so that one chatty rank cannot starve others.
  for (int reads = 0; stream.fd && (drain ? reads < 1024 : reads < 1); ++reads) {
    ssize_t n = ::read(stream.fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {
      emitLines(rank.index, stream, true);
      stream.fd.reset();
      break;
    }
    stream.pending.append(buf, static_cast<size_t>(n));
    emitLines(rank.index, stream, false);
  }
  if (drain && stream.fd) {
    emitLines(rank.index, stream, true);
    stream.fd.reset();
  }
}

void Job::loop() {
  std::vector<pollfd> fds;
  std::vector<Stream*> streamOf;
  std::vector<Rank*> rankOf;
  while (running_ > 0) {
    fds.clear();
    streamOf.clear();
    rankOf.clear();
    fds.push_back({signalFd_.get(), POLLIN, 0});
    streamOf.push_back(nullptr);
    rankOf.push_back(nullptr);
    for (Rank& rank : ranks_) {
      for (Stream* stream : {&rank.out, &rank.err}) {
        if (!stream->fd) continue;
        fds.push_back({stream->fd.get(), POLLIN, 0});
        streamOf.push_back(stream);
        rankOf.push_back(&rank);
      }
    }
    std::optional<Clock::time_point> wake;
    if (phase_ == Phase::Running && timeoutDeadline_) wake = timeoutDeadline_;
    if (phase_ == Phase::Grace || phase_ == Phase::Term) wake = phaseDeadline_;
    int timeoutMs = -1;
    if (wake) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(*wake - Clock::now()).count();
      timeoutMs = static_cast<int>(std::clamp<long long>(left, 0, 60'000));
    }
    int n = ::poll(fds.data(), fds.size(), timeoutMs);
    if (n < 0 && errno != EINTR) {
      say("poll failed: " + errnoText(errno) + "; ending the job");
      if (!exitStatus_) exitStatus_ = 1;
      signalRanks(SIGKILL);
      phase_ = Phase::Kill;
      // Blocking waits still collect the ranks below.
      for (Rank& rank : ranks_) {
        int status;
        if (rank.running && ::waitpid(rank.pid, &status, 0) == rank.pid) {
          rank.running = false;
          --running_;
        }
      }
      return;
    }
    if (n > 0) {
      if (fds[0].revents) handleSignals();
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents) readStream(*rankOf[i], *streamOf[i], false);
      }
    }
    reap();
    checkDeadlines();
  }
}

int Job::run() {
  if (!setUp()) return kExitUsage;
  ranks_.resize(static_cast<size_t>(options_.np));
  for (int r = 0; r < options_.np; ++r) {
    if (!launch(r)) {
      exitStatus_ = launchStatus_;
      listener_.reset();
      // The ranks already started cannot form a job: end them at once.
      if (running_ > 0) startTeardown(Phase::Term);
      break;
    }
  }
  loop();
  // Everything the ranks wrote before exiting is in the pipes now; children they left behind
  // may hold the pipes open, so read what is there without waiting for end-of-file.
  for (Rank& rank : ranks_) {
    readStream(rank, rank.out, true);
    readStream(rank, rank.err, true);
  }
  return exitStatus_.value_or(0);
}

}  // namespace

int runJob(const Options& options) noexcept {
  try {
    Job job(options);
    return job.run();
  } catch (const std::exception& e) {
    say(std::string("internal error: ") + e.what());
  } catch (...) {
    say("internal error");
  }
  return kExitUsage;
}

}  // namespace strata::run
