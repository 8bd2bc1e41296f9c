// What a test process uses, read from /proc/self: resident memory, open descriptors, threads.
// Header-only, for the stress jobs (tests/stress/scale.cpp, soak.cpp) that report them.
#pragma once

#include <dirent.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace strata::test {

/// Entries of a directory, without "." and "..".
inline int countEntries(const char* dir) {
  int n = 0;
  if (DIR* d = opendir(dir)) {
    while (dirent* e = readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ++n;
    }
    closedir(d);
  }
  return n;
}

struct ProcStats {
  long rssKiB = 0;
  int fds = 0;
  int threads = 0;
};

inline ProcStats procStats() {
  ProcStats s;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rssKiB = std::atol(line.c_str() + 6);
    if (line.rfind("Threads:", 0) == 0) s.threads = std::atoi(line.c_str() + 8);
  }
  s.fds = countEntries("/proc/self/fd") - 1;  // opendir's own descriptor
  return s;
}

}  // namespace strata::test
