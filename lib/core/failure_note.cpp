// The failure notes between the ranks of a host. A rank whose call fails because of a peer
// (Timeout, PeerLost) usually exits soon after. The other ranks of its host then see only that
// a rank of their host exited (shm) and would name it, not the cause: a rank of another host
// whose link went down (tests/stress/net_faults.sh). So the failing rank leaves them a note on
// the bootstrap, whose connections inside the host still work, and a rank that lost a peer of
// its host reads that peer's note into its own error.

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "base/process.hpp"
#include "base/watch_calls.hpp"
#include "communicator_impl.hpp"

namespace strata {

namespace {

/// Bootstrap tag of the note a rank whose call failed because of a peer leaves to the other
/// ranks of its host (lib/transport's records use 0x5354xxxx).
constexpr int kTagFailureNote = 0x53430001;
/// Bytes of the note (recv needs the size): the error's text, cut to fit.
constexpr size_t kFailureNoteBytes = 2048;

}  // namespace

void Communicator::Impl::leaveNote(const Error& e) const noexcept {
  if ((e.code() != ErrorCode::PeerLost && e.code() != ErrorCode::Timeout &&
       e.code() != ErrorCode::ProtocolError) ||
      e.peer() < 0) {
    return;
  }
  // "root N\n<who is at fault>\n<this rank's error>": N is the rank that diagnose() found at
  // fault (-1: none), so that a rank reading the note can name it first as well.
  std::array<char, kFailureNoteBytes> note{};
  const watch::Verdict v = watch::lastVerdict();
  std::string text =
      fmt::format("root {}\n{}\nrank {} failed first: {}", v.culprit, v.text, rank, e.what());
  std::memcpy(note.data(), text.data(), std::min(text.size(), note.size() - 1));
  for (int p = 0; p < size; ++p) {
    // The peer of the error is left out when it is the one at fault (or nothing more is known):
    // not when the diagnosis found another rank, or this one (a mismatched call), at fault.
    if (p == rank || (p == e.peer() && (v.culprit < 0 || v.culprit == p))) continue;
    try {
      // Small and on a connection the context's set-up opened: the kernel takes it at once.
      if (context->sameHost(p)) bootstrap->send(p, kTagFailureNote, note.data(), note.size());
    } catch (const std::exception&) {
      // That rank is gone too; nothing to tell.
    }
  }
}

Error Communicator::Impl::explain(const Error& e) const {
  const int q = e.peer();
  if (e.code() != ErrorCode::PeerLost || q < 0 || q == rank || q >= size) return e;
  try {
    if (!context->sameHost(q)) return e;
    // Only a process that is gone: its bootstrap connection is closed, so the receive ends at
    // once with its note (sent before it exited) or with PeerLost. A live one may not send any.
    const int32_t pid = context->pid(q);
    if (pid <= 0 || !process::gone(pid)) return e;
    std::array<char, kFailureNoteBytes> note{};
    bootstrap->recv(q, kTagFailureNote, note.data(), note.size());
    note.back() = '\0';
    std::string_view all(note.data());
    int root = -1;
    std::string verdict, first(all);
    if (all.rfind("root ", 0) == 0) {
      auto nl1 = all.find('\n');
      auto nl2 = nl1 == std::string_view::npos ? nl1 : all.find('\n', nl1 + 1);
      if (nl2 != std::string_view::npos) {
        root = std::atoi(std::string(all.substr(5, nl1 - 5)).c_str());
        verdict = all.substr(nl1 + 1, nl2 - nl1 - 1);
        first = all.substr(nl2 + 1);
      }
    }
    if (root >= 0 && root < size && !verdict.empty()) {
      // The rank that exited had found who was at fault: say that first.
      if (root == q) {
        return Error(e.code(),
                     fmt::format("{} (as rank {} found before it failed and exited). This rank "
                                 "({}): {}",
                                 verdict, q, rank, e.what()),
                     root);
      }
      return Error(e.code(),
                   fmt::format("{} (found by rank {} before it failed and exited). This rank "
                               "({}): {} ({})",
                               verdict, q, rank, e.what(), first),
                   root);
    }
    return Error(e.code(), fmt::format("{} ({})", e.what(), first), q);
  } catch (const std::exception&) {
    return e;  // no note: it exited without failing a call (killed, or another cause)
  }
}

}  // namespace strata
