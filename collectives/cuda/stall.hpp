#pragma once

// Which device collective each rank is in, so that the module's monitor can tell a rank that is
// merely late (not an error: the kernels wait) from a stall (every rank's kernel of the same call
// running, none finishing, for transport.timeout) or a mismatch (a peer's call of the same
// number is another operation, count, type, reduce op or root). Each rank publishes a board in
// host memory its peers on the host map; the host side writes it, the kernels only store the
// number of the call they began. No CUDA here: the emulation's tests judge boards directly.

#include <cstdint>
#include <string>
#include <vector>

#include "kernel_common.hpp"

namespace strata::cuda {

/// One collective call as every rank must make it: two words, zero for none.
struct CallSignature {
  uint64_t shape = 0;  ///< 1 | op << 8 | type << 16 | redop << 24 | (root + 1) << 32
  uint64_t count = 0;
  bool operator==(const CallSignature&) const = default;
  static CallSignature of(int op, int type, int redop, int root, uint64_t count) {
    CallSignature s;
    s.shape = 1 | (static_cast<uint64_t>(op & 0xff) << 8) |
              (static_cast<uint64_t>(type & 0xff) << 16) |
              (static_cast<uint64_t>(redop & 0xff) << 24) |
              (static_cast<uint64_t>((root + 1) & 0xffff) << 32);
    s.count = count;
    return s;
  }
  int op() const { return static_cast<int>((shape >> 8) & 0xff); }
  int type() const { return static_cast<int>((shape >> 16) & 0xff); }
  int redop() const { return static_cast<int>((shape >> 24) & 0xff); }
  int root() const { return static_cast<int>((shape >> 32) & 0xffff) - 1; }
};

/// "allReduce(count 1000, float, sum)", "broadcast(count 8, int32, root 1)": the words the
/// host collectives use (backend::CollectiveOp and strata::DataType numbering).
inline std::string describe(const CallSignature& s) {
  static const char* const ops[] = {"?",         "allReduce", "allGather", "reduceScatter",
                                    "broadcast", "allToAll",  "send",      "recv"};
  static const char* const types[] = {"int8",   "uint8", "int32",    "uint32", "int64",
                                      "uint64", "half",  "bfloat16", "float",  "double"};
  static const char* const redops[] = {"sum", "prod", "min", "max", "avg"};
  const int op = s.op(), type = s.type(), redop = s.redop();
  std::string out = std::string(op >= 0 && op < 8 ? ops[op] : "?") + "(count " +
                    std::to_string(s.count) + ", " + (type >= 0 && type < 10 ? types[type] : "?");
  if (op == 1 || op == 3)
    out += std::string(", ") + (redop >= 0 && redop < 5 ? redops[redop] : "?");
  if (op == 4) out += ", root " + std::to_string(s.root());
  return out + ")";
}

/// What one rank publishes (host memory, mapped by its peers; written by its host side only).
struct LaunchBoard {
  static constexpr uint64_t kHistory = kCallSlots;
  uint64_t issued = 0;     ///< device collectives enqueued, numbered from 1 (P2P not counted)
  uint64_t completed = 0;  ///< every call up to this number completed
  /// Call k at [k % kHistory], tagged with k (0 while it is being rewritten); `begun` is k once
  /// its kernel began (the kernels' KernelArgs::started word, copied by the monitor).
  struct Entry {
    uint64_t call = 0;
    CallSignature sig;
    uint64_t begun = 0;
  } calls[kHistory];
};

/// A rank's board as read at one moment (a copy: the peers' change under the reader).
struct BoardView {
  uint64_t issued = 0, completed = 0;
  std::vector<LaunchBoard::Entry> calls;  ///< kHistory entries; call 0: unreadable
  /// Call k's signature; empty when the board no longer (or not yet) holds it.
  CallSignature call(uint64_t k) const {
    if (k == 0 || calls.size() != LaunchBoard::kHistory) return {};
    const LaunchBoard::Entry& e = calls[k % LaunchBoard::kHistory];
    return e.call == k ? e.sig : CallSignature{};
  }
  /// Whether call k's kernel began (false when the board no longer holds call k).
  bool begun(uint64_t k) const {
    if (k == 0 || calls.size() != LaunchBoard::kHistory) return false;
    const LaunchBoard::Entry& e = calls[k % LaunchBoard::kHistory];
    return e.call == k && e.begun == k;
  }
};

/// Reads a board that its owner may be writing: an entry counts only when its tag read the
/// same before and after its signature (publishCall clears the tag first).
inline BoardView readBoard(const LaunchBoard* b) {
  BoardView v;
  v.issued = __atomic_load_n(&b->issued, __ATOMIC_ACQUIRE);
  v.calls.resize(LaunchBoard::kHistory);
  for (uint64_t i = 0; i < LaunchBoard::kHistory; ++i) {
    const LaunchBoard::Entry& e = b->calls[i];
    const uint64_t before = __atomic_load_n(&e.call, __ATOMIC_ACQUIRE);
    LaunchBoard::Entry got;
    got.sig.shape = __atomic_load_n(&e.sig.shape, __ATOMIC_ACQUIRE);
    got.sig.count = __atomic_load_n(&e.sig.count, __ATOMIC_ACQUIRE);
    got.begun = __atomic_load_n(&e.begun, __ATOMIC_ACQUIRE);
    const uint64_t after = __atomic_load_n(&e.call, __ATOMIC_ACQUIRE);
    got.call = before == after ? before : 0;
    v.calls[i] = got;
  }
  v.completed = __atomic_load_n(&b->completed, __ATOMIC_ACQUIRE);
  return v;
}

/// Publishes call k (the host side, before the launch): the entry's tag cleared, its signature
/// (release: seen only after the clear), the tag, then `issued`.
inline void publishCall(LaunchBoard* b, uint64_t k, const CallSignature& s) {
  LaunchBoard::Entry& e = b->calls[k % LaunchBoard::kHistory];
  __atomic_store_n(&e.call, uint64_t{0}, __ATOMIC_RELAXED);
  __atomic_store_n(&e.sig.shape, s.shape, __ATOMIC_RELEASE);
  __atomic_store_n(&e.sig.count, s.count, __ATOMIC_RELEASE);
  __atomic_store_n(&e.call, k, __ATOMIC_RELEASE);
  __atomic_store_n(&b->issued, k, __ATOMIC_RELEASE);
}

/// Marks call k begun (the monitor, when the kernels' word says so); nothing when the entry
/// already holds a later call.
inline void markBegun(LaunchBoard* b, uint64_t k) {
  LaunchBoard::Entry& e = b->calls[k % LaunchBoard::kHistory];
  if (__atomic_load_n(&e.call, __ATOMIC_ACQUIRE) == k)
    __atomic_store_n(&e.begun, k, __ATOMIC_RELEASE);
}

/// What the monitor decided about this rank's oldest unfinished call.
struct StallVerdict {
  enum Kind { None, Mismatch, Stall } kind = None;
  int peer = -1;     ///< the rank named (a mismatched one; for a stall, the lowest other rank)
  std::string text;  ///< the error's text
};

/// Judges call k (this rank's oldest unfinished device collective, whose kernel began
/// `runningSeconds` ago; negative: not begun) against the boards of every rank (boards[rank] is
/// this rank's). A peer whose call k is another call: Mismatch at once (whatever the time). Every
/// peer's kernel of call k began, none finished it, and this rank's has run for
/// `timeoutSeconds`: Stall. A peer that has not begun call k is late, which is no error: None
/// (so is one whose board no longer holds call k: nothing is judged on what is not known).
inline StallVerdict judgeStall(int rank, const std::vector<BoardView>& boards, uint64_t k,
                               double runningSeconds, double timeoutSeconds) {
  StallVerdict v;
  if (k == 0 || rank < 0 || static_cast<size_t>(rank) >= boards.size()) return v;
  const CallSignature mine = boards[static_cast<size_t>(rank)].call(k);
  if (mine == CallSignature{}) return v;
  bool everyoneIn = true;
  int firstOther = -1;
  for (size_t q = 0; q < boards.size(); ++q) {
    if (static_cast<int>(q) == rank) continue;
    if (firstOther < 0) firstOther = static_cast<int>(q);
    const BoardView& b = boards[q];
    const CallSignature theirs = b.call(k);
    if (theirs != CallSignature{} && theirs != mine) {
      v.kind = StallVerdict::Mismatch;
      v.peer = static_cast<int>(q);
      v.text = "rank " + std::to_string(q) + "'s device collective #" + std::to_string(k) + " is " +
               describe(theirs) + " while rank " + std::to_string(rank) + "'s is " +
               describe(mine) +
               ": every rank must call the same collectives in the same order with the same "
               "counts, types, reduce ops and roots";
      return v;
    }
    if (!b.begun(k)) everyoneIn = false;
    if (b.completed >= k) everyoneIn = false;  // it finished: not a stall of every rank
  }
  if (everyoneIn && runningSeconds >= timeoutSeconds && runningSeconds >= 0 && firstOther >= 0) {
    v.kind = StallVerdict::Stall;
    v.peer = firstOther;
    v.text = "every rank's kernel of device collective #" + std::to_string(k) + " (" +
             describe(mine) + ") has run for " + std::to_string(static_cast<int>(runningSeconds)) +
             " s (transport.timeout = " + std::to_string(static_cast<int>(timeoutSeconds)) +
             " s) and none has finished it: the kernels wait for each other (a bug in strata, or "
             "a GPU fault)";
  }
  return v;
}

}  // namespace strata::cuda
