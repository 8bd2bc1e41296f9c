#include "job.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "environment.hpp"
#include "io.hpp"
#include "relay.hpp"
#include "root_socket.hpp"

namespace strata::run {
namespace {

using Clock = std::chrono::steady_clock;

// Signals strata-run passes on to every rank.
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

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

struct Rank {
  int index = 0;
  pid_t pid = -1;
  bool running = false;
  Stream out;
  Stream err;
};

class Job {
 public:
  explicit Job(const Options& options) : options_(options), environment_(options) {}
  int run();

 private:
  enum class Phase { Running, Grace, Term, Kill };

  bool setUp();
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
  std::vector<int> runningRanks() const;

  const Options& options_;
  std::vector<Rank> ranks_;
  std::unordered_map<pid_t, int> byPid_;
  int running_ = 0;

  Environment environment_;
  std::string rootAddress_;
  int rootPort_ = 0;
  Fd listener_;
  Fd signalFd_;
  Fd devNull_;
  sigset_t oldMask_{};
  rlimit oldNoFile_{};
  bool raisedNoFile_ = false;
  pid_t self_ = 0;
  std::vector<int> cpus_;  ///< --bind-to core: the CPUs strata-run may use, in order

  Phase phase_ = Phase::Running;
  Clock::time_point phaseDeadline_{};
  std::optional<Clock::time_point> timeoutDeadline_;
  std::optional<int> exitStatus_;  // decided by the first failure, timeout or launch error
  int lost_ = 0;                   // ranks killed by a signal under --keep-going
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
  if (!environment_.makeSecret(error) ||
      !openRootSocket(options_, listener_, rootAddress_, rootPort_, error)) {
    say(error);
    return false;
  }
  if (options_.torch && !environment_.chooseTorchMaster(rootPort_)) return false;
  if (options_.output == OutputMode::Directory && !createOutputDir(options_.outputDir)) {
    return false;
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
  environment_.buildBase();
  return true;
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

  std::vector<std::string> envStrings = environment_.forRank(r, rootAddress_, listener_.get());
  std::vector<char*> envp;
  for (auto& s : envStrings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argStrings = options_.command;
  std::vector<char*> argv;
  for (auto& s : argStrings) argv.push_back(s.data());
  argv.push_back(nullptr);

  Fd outWrite, errWrite;
  if (!openRankOutput(options_, r, rank.out, rank.err, outWrite, errWrite)) {
    launchStatus_ = kExitUsage;
    return false;
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
  if (options_.keepGoing && phase_ == Phase::Running && WIFSIGNALED(status)) {
    // Lost, not failed: the survivors go on without it (--keep-going).
    say(line + "; --keep-going: the other ranks run on");
    ++lost_;
    return;
  }
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
        if (fds[i].revents) relayStream(rankOf[i]->index, *streamOf[i], false);
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
    relayStream(rank.index, rank.out, true);
    relayStream(rank.index, rank.err, true);
  }
  // --keep-going with every rank killed: nobody finished the job.
  if (!exitStatus_ && lost_ == options_.np) return 128 + SIGKILL;
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
