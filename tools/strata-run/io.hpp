#pragma once

// What every part of strata-run uses: an owned file descriptor, whole writes, errno as text and
// strata-run's own messages on stderr.

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

namespace strata::run {

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

inline bool writeAll(int fd, std::string_view data) noexcept {
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
inline void say(const std::string& message) noexcept {
  try {
    writeAll(STDERR_FILENO, "strata-run: " + message + "\n");
  } catch (...) {
  }
}

inline std::string errnoText(int err) {
  return std::strerror(err);
}

}  // namespace strata::run
