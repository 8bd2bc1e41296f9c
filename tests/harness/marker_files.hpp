#pragma once

// Marker files in a directory the test script and the ranks share: how the stress tests' ranks
// tell the script where they are and wait for its go, without sleeps deciding anything.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace strata::test {

inline bool markerExists(const std::string& dir, const std::string& name) {
  return ::access((dir + "/" + name).c_str(), F_OK) == 0;
}

/// Writes `text` to dir/name atomically (a reader never sees a half-written file); exits with
/// status 2 naming `who` when the directory cannot be written.
inline void writeMarker(const std::string& dir, const std::string& name, const std::string& text,
                        const char* who) {
  std::string tmp = dir + "/." + name + ".tmp", path = dir + "/" + name;
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "%s: cannot write %s\n", who, tmp.c_str());
    std::exit(2);
  }
  std::fputs(text.c_str(), f);
  std::fclose(f);
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace strata::test
