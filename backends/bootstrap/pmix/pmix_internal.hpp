#pragma once

// Private to the pmix backend (backends/bootstrap/pmix): what its files share. pmix_client.cpp
// talks to the PMIx library (the one connection per process, the job identity, fences, puts
// and gets with their error texts); pmix_records.cpp holds the records this backend puts into
// PMIx, their keys and the data fence that moves them; pmix_exchange.cpp exchanges the mesh
// addresses and rank 0's job secret at creation; pmix_collectives.cpp runs allGather, broadcast
// and barrier as fences or over the mesh; pmix_bootstrap.cpp is the class and the module entry
// point. docs/backends.md ("The pmix backend") explains the design.

#include <pmix.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/wire.hpp"
#include "mesh/peer_mesh.hpp"
#include "pmix_bootstrap.hpp"

namespace strata::pmix {

inline constexpr const char* kSub = "pmix";

inline constexpr size_t kMaxAddress = 64;  // "[ipv6]:port" fits
inline constexpr size_t kMaxSecret = 256;
// Record header (12) + op u8 + instance u64 + seq u64 + rank i32 + payload length u32.
inline constexpr size_t kValueOverhead = wire::kRecordHeaderSize + 1 + 8 + 8 + 4 + 4;
inline constexpr size_t kCreatePayloadMax = 4 + kMaxAddress + 4 + kMaxSecret;
inline constexpr size_t kMaxValue = 8192;
static_assert(kValueOverhead + kCreatePayloadMax <= kMaxValue);

// --- the PMIx library (pmix_client.cpp) ---------------------------------------------------

// One PMIx client connection per process, shared by every PmixBootstrap in it.
//
// It is opened by the first bootstrap and kept until the process exits (an atexit handler drops
// the last reference), although each bootstrap still takes and drops its own reference with
// PMIx_Init/PMIx_Finalize. Measured under Slurm 22.05 and Open MPI 4.1.4 with libpmix 4.2.2:
// a client that finalizes and re-initialises loses its own per-process job keys
// (PMIX_LOCAL_RANK: NOT-FOUND), and under Slurm a rank that finalizes while faster ranks have
// already entered the next fence makes that fence fail with PARTIAL-SUCCESS / INVALID-ARG.
// Create/destroy cycles are therefore only reliable if the connection outlives them.
struct Session {
  std::mutex mu;  // guards everything below but the fence state
  bool open = false;
  bool closed = false;  // finalized at exit
  pid_t pid = 0;
  int refs = 0;  // PMIx_Init calls not yet finalized, the process-lifetime one included
  pmix_proc_t me{};
  int rank = -1, size = 0, localRank = -1, localSize = 0;
  uint64_t instances = 0;
  std::atomic<bool> aborted{false};

  // Fences are job-wide, so one runs at a time per process. Data fences alternate between two
  // keys ("slots"): a rank re-puts slot k for data fence c+2 only after data fence c+1
  // completed, which every rank entered only after finishing its Gets of fence c.
  std::mutex fenceMu;
  uint64_t dataFences = 0;
};

Session& session();

/// Takes one PMIx reference for a new bootstrap (opening the connection and reading the job
/// identity on first use); returns its instance number.
uint64_t acquire();
/// Drops a reference taken by acquire(); the process-lifetime one stays until exit.
void release() noexcept;

/// Every PMIx failure becomes BackendError naming the call; a PMIx timeout becomes Timeout
/// naming the bootstrap operation.
[[noreturn]] void fail(std::string_view what, pmix_status_t rc, double timeout, int peer = -1);

/// One job-wide fence (collecting data when `collect`), bounded by `timeout` seconds. The caller
/// holds session().fenceMu.
void fence(bool collect, double timeout, std::string_view what);
/// PMIx_Put of `value` as a byte object under `key` (global scope), then PMIx_Commit.
void put(const char* key, const std::vector<uint8_t>& value, std::string_view what);
/// Rank `peer`'s byte object under `key`, at most kMaxValue bytes.
std::vector<uint8_t> get(int peer, const char* key, double timeout, std::string_view what);

// --- records, keys and data fences (pmix_records.cpp) -------------------------------------

enum class Op : uint8_t { Create = 1 };

/// One value put into PMIx (docs/backends.md, "PMIx records and keys").
struct Value {
  Op op;
  uint64_t instance;
  uint64_t seq;
  int32_t rank;
  std::vector<uint8_t> payload;
};

std::vector<uint8_t> encodeValue(const Value& v);

/// Decodes rank `from`'s value and checks that it belongs to this very call: ranks that called
/// collectives in different orders get a ProtocolError instead of each other's data.
std::vector<uint8_t> decodeValue(const std::vector<uint8_t>& rec, const Value& expect, int from);

/// Put (when `mine` is set), one collecting fence, and Gets of the ranks in `from`.
/// `payloadBound` is the largest payload any rank may put in this call (the same on every rank,
/// so that all agree on the key).
std::vector<std::vector<uint8_t>> dataFence(const std::vector<uint8_t>* mine, size_t payloadBound,
                                            const std::vector<int>& from, double timeout,
                                            std::string_view what);

// --- the exchange at creation (pmix_exchange.cpp) ------------------------------------------

/// What every rank learns when a bootstrap is created.
struct MeshDirectory {
  std::vector<std::string> addresses;  ///< every rank's mesh listener, this rank's included
  std::string secret;                  ///< rank 0's job secret
};

/// Publishes this rank's listener `address` (and, on rank 0, a new job secret) and collects
/// everyone's in one collecting fence bounded by `timeout` seconds. `others` are every rank but
/// `rank`, in order.
MeshDirectory exchangeAddresses(uint64_t instance, int rank, int size,
                                const std::vector<int>& others, const std::string& address,
                                double timeout);

// --- the bootstrap's state (pmix_bootstrap.cpp, pmix_collectives.cpp) ----------------------

struct PmixBootstrap::Impl {
  uint64_t instance = 0;
  int rank = -1, size = 0, localRank = -1, localSize = 0;
  double timeout = 30;
  bool released = false;
  std::unique_ptr<mesh::PeerMesh> mesh;
  std::atomic<bool> aborted{false};
  std::string abortReason;

  void checkNotAborted() const {
    if (aborted) {
      throw Error(ErrorCode::Aborted,
                  fmt::format("pmix bootstrap: this rank called abort(): {}", abortReason), rank);
    }
  }

  std::vector<int> others() const {
    std::vector<int> v;
    for (int r = 0; r < size; ++r) {
      if (r != rank) v.push_back(r);
    }
    return v;
  }
};

}  // namespace strata::pmix
