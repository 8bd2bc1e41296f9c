#pragma once

// The order in which a rank's CUDA collectives let go of their memory, over the calls its
// backend gives (the module: CUDA events, the bootstrap's barrier, IPC unmapping; the emulation:
// threads and a poisoning free), so that tests/cuda-emu runs the module's sequence. No CUDA here.

#include <exception>
#include <string>

namespace strata::cuda {

/// What teardownSequence asks of its backend:
///   bool stopped()                 the stop word is set (a lost peer, or an abort)
///   bool peerLost()                it was set because a peer process is gone
///   bool waitPending(double s)     true once every launch of this communicator completed
///   void raiseStop()               sets the stop word: every wait of this rank's kernels ends
///   void workDone()                the launches are over (stop the monitor, drop events)
///   void barrier()                 every rank of the communicator; throws when it fails
///   void unmapPeers()              closes the mappings of the peers' scratch
///   void leak()                    keeps all memory for the process's life (launches still run)
///   void warn(const std::string&)  logs a warning
/// Returns true when the caller may free this rank's own memory, false when it was leaked.
///
/// 1. This communicator's work: done normally within `timeoutSeconds`, else stopped (a peer
///    that never comes, or is dead: the kernels see the stop word within a few hundred spins);
///    launches that still run 5 s after the stop keep every byte (leaked: they cannot fault).
/// 2. A barrier: no peer's launch still reads or writes this rank's scratch once every rank is
///    here (each came after its own launches ended). Then this rank unmaps the peers' scratch, and
///    after a second barrier no peer maps its own, which the caller then frees. Both barriers are
///    skipped when a peer is lost (it cannot come) and after a failed one (bounded by the
///    bootstrap's timeout).
template <class Api>
bool teardownSequence(Api& api, int size, double timeoutSeconds) {
  if (api.stopped() || !api.waitPending(timeoutSeconds > 0 ? timeoutSeconds : 30)) {
    api.raiseStop();
    if (!api.waitPending(5)) {
      api.leak();
      return false;
    }
  }
  api.workDone();
  auto barrier = [&api](const char* when) {
    try {
      api.barrier();
      return true;
    } catch (const std::exception& e) {
      api.warn(std::string("destroying the communicator: barrier ") + when +
               " unmapping failed: " + e.what());
      return false;
    }
  };
  const bool barriers = !api.peerLost() && size > 1 && barrier("before");
  api.unmapPeers();
  if (barriers) barrier("after");
  return true;
}

}  // namespace strata::cuda
