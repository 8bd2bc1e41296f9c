#include "tests/transport/shm/shm_fixtures.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <thread>

std::unique_ptr<Transport> makeTransport(int rank) {
  return strata::shm::createShmTransport(strata::testing::pairInit(rank, kHostId));
}

PeerInfo peerOf(int rank, pid_t pid) {
  return strata::testing::sameHostPeer(rank, pid, kHostId);
}

pid_t runChild(const std::function<void()>& fn) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int status = 0;
    try {
      fn();
    } catch (const Error& e) {
      std::fprintf(stderr, "child %d: strata::Error(%s): %s\n", getpid(),
                   std::string(strata::toString(e.code())).c_str(), e.what());
      status = e.code() == ErrorCode::NotSupported ? 3 : 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", getpid(), e.what());
      status = 1;
    }
    std::fflush(nullptr);
    _exit(status);
  }
  return pid;
}

int waitChild(pid_t pid, double timeoutSeconds) {
  auto deadline = Clock::now() + std::chrono::duration<double>(timeoutSeconds);
  int status = 0;
  while (true) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

void expectError(ErrorCode code, const std::function<void()>& fn, const std::string& what,
                 int expectedPeer) {
  try {
    fn();
  } catch (const Error& e) {
    if (e.code() != code) {
      throw std::runtime_error(what + ": expected " + std::string(strata::toString(code)) +
                               ", got " + std::string(strata::toString(e.code())) + ": " +
                               e.what());
    }
    if (expectedPeer >= -1 && e.peer() != expectedPeer) {
      throw std::runtime_error(what + ": error names peer " + std::to_string(e.peer()) +
                               ", expected " + std::to_string(expectedPeer));
    }
    return;
  }
  throw std::runtime_error(what + ": no error thrown");
}

Pipe::Pipe() {
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
}

Pipe::~Pipe() {
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
}

void Pipe::send(const std::vector<uint8_t>& data) const {
  uint32_t n = static_cast<uint32_t>(data.size());
  check(::write(fds[1], &n, 4) == 4, "pipe write");
  if (n > 0) check(::write(fds[1], data.data(), n) == static_cast<ssize_t>(n), "pipe write");
}

std::vector<uint8_t> Pipe::receive(double timeoutSeconds) const {
  auto readExact = [&](void* p, size_t n) {
    size_t done = 0;
    auto deadline = Clock::now() + std::chrono::duration<double>(timeoutSeconds);
    while (done < n) {
      pollfd pf{fds[0], POLLIN, 0};
      int ms = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
      check(ms > 0 && poll(&pf, 1, ms) == 1, "pipe read timed out");
      ssize_t r = ::read(fds[0], static_cast<char*>(p) + done, n - done);
      check(r > 0, "pipe closed");
      done += static_cast<size_t>(r);
    }
  };
  uint32_t n = 0;
  readExact(&n, 4);
  std::vector<uint8_t> data(n);
  if (n > 0) readExact(data.data(), n);
  return data;
}

size_t countOpenFds() {
  size_t n = 0;
  DIR* dir = opendir("/proc/self/fd");
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

bool ptraceRestricted() {
  FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  if (f == nullptr) return false;
  int scope = 0;
  if (std::fscanf(f, "%d", &scope) != 1) scope = 0;
  std::fclose(f);
  return scope > 0;
}

bool isZero(const TransportStats& s) {
  return s.registrations == 0 && s.imports == 0 && s.connections == 0;
}
