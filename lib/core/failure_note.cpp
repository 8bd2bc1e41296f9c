// The failure notes between the ranks of a host. A rank whose call fails because of a peer
// (Timeout, PeerLost) usually exits soon after. The other ranks of its host then see only that
// a rank of their host exited (shm) and would name it, not the cause: a rank of another host
// whose link went down (tests/stress/net_faults.sh). So the failing rank leaves them a note on
// the bootstrap, whose connections inside the host still work, and a rank that lost a peer of
// its host reads that peer's note into its own error. The note is a wire record
// (failure_note_codec.hpp).

#include <cstdint>
#include <exception>
#include <vector>

#include "base/process.hpp"
#include "base/watch_calls.hpp"
#include "communicator_impl.hpp"
#include "failure_note_codec.hpp"

namespace strata {

namespace {

/// Bootstrap tag of the notes (lib/transport's records use 0x5354xxxx).
constexpr int kTagFailureNote = 0x53430001;

}  // namespace

void Communicator::Impl::leaveNote(const Error& e) const noexcept {
  if ((e.code() != ErrorCode::PeerLost && e.code() != ErrorCode::Timeout &&
       e.code() != ErrorCode::ProtocolError) ||
      e.peer() < 0) {
    return;
  }
  // The culprit is the rank that diagnose() found at fault, so that a rank reading the note can
  // name it first as well.
  const watch::Verdict v = watch::lastVerdict();
  std::vector<uint8_t> note;
  try {
    note = core::encodeFailureNote({v.culprit, v.text, rank, e.what()});
  } catch (const std::exception&) {
    return;  // out of memory: the others report what they see themselves
  }
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
    std::vector<uint8_t> note(core::kFailureNoteSlot);
    bootstrap->recv(q, kTagFailureNote, note.data(), note.size());
    return core::explainWithNote(e, note, q, rank, size);
  } catch (const std::exception&) {
    return e;  // no note: it exited without failing a call (killed, or another cause)
  }
}

}  // namespace strata
