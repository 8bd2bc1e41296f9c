#pragma once

// Sample reports for the watch's unit tests (test_codec.cpp, test_analysis.cpp): rank r of a job
// runs on host "h<r>" with pid 100 + r.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "watch/codec.hpp"

namespace strata::watch::samples {

inline CallReport call(std::string domain, std::string op, uint64_t seq, int32_t waitingFor = -1) {
  CallReport c;
  c.domain = std::move(domain);
  c.op = std::move(op);
  c.seq = seq;
  c.seconds = 5.5;
  c.waitingFor = waitingFor;
  if (waitingFor >= 0) {
    c.waitingSeconds = 5.0;
    c.detail = "0 of 3 pieces from it received";
  }
  return c;
}

inline RankReport state(int rank, int size, std::vector<CallReport> calls = {}) {
  RankReport s;
  s.rank = rank;
  s.size = size;
  s.pid = 100 + rank;
  s.host = "h" + std::to_string(rank);
  s.jobId = 0xabc;
  s.calls = std::move(calls);
  return s;
}

}  // namespace strata::watch::samples
