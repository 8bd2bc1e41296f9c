// Fault tolerance (docs/fault-tolerance.md): revoke, and shrink with the survivors' agreement on
// whom to exclude. A revoke travels through the watch's status services (Scope::broadcastRevoke),
// so that a rank learns it whatever it is doing; it stops the context (Context::revoke), whose
// connections and collectives backends then fail every call and wait. Shrink agrees over this
// communicator's bootstrap, point to point between the survivors, and builds the new communicator
// on a subset of that bootstrap (bootstrap/subset.hpp): no rendezvous, nothing through a rank that
// may be dead.

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <strata/communicator.hpp>
#include <strata/error.hpp>

#include "base/crypto.hpp"
#include "base/log.hpp"
#include "bootstrap/subset.hpp"
#include "bootstrap/watched.hpp"
#include "communicator_impl.hpp"

namespace strata {

namespace {

// Bootstrap tags of shrink (lib/transport's records use 0x5354xxxx, failure notes 0x5343xxxx):
// the agreement's rounds, and the subset each attempt builds. Both carry the shrink's number
// (mod 256) and the attempt, so that nothing of an earlier one is taken for a later one.
constexpr int kTagAgree = 0x53460000;
constexpr int kTagSubset = 0x53450000;
constexpr int kMaxAttempts = 8;
constexpr int kRounds = 2;

int agreeTag(int shrink, int attempt, int round) {
  return kTagAgree + ((shrink & 0xff) << 8) + (attempt << 2) + round;
}
int subsetTag(int shrink, int attempt) {
  return kTagSubset + ((shrink & 0xff) << 8) + attempt;
}

/// A set of ranks of a communicator of n ranks as a bitmap, (n + 7) / 8 bytes.
std::vector<uint8_t> toBits(const std::set<int>& ranks, int n) {
  std::vector<uint8_t> bits(static_cast<size_t>(n + 7) / 8, 0);
  for (int r : ranks) bits[static_cast<size_t>(r) / 8] |= static_cast<uint8_t>(1u << (r % 8));
  return bits;
}

std::set<int> fromBits(const std::vector<uint8_t>& bits, int n, int from) {
  std::set<int> out;
  for (int r = 0; r < static_cast<int>(bits.size()) * 8; ++r) {
    if (!(bits[static_cast<size_t>(r) / 8] & (1u << (r % 8)))) continue;
    if (r >= n) {
      throw Error(ErrorCode::ProtocolError,
                  fmt::format("shrink: rank {} sent an excluded set with rank {} of a "
                              "communicator of {} ranks",
                              from, r, n),
                  from);
    }
    out.insert(r);
  }
  return out;
}

/// Rank `by` sent an excluded set that names this rank `me`: it is not a survivor.
[[noreturn]] void excludedBy(int by, int me) {
  throw Error(ErrorCode::Aborted,
              fmt::format("shrink: rank {} excluded this rank {} (it found it lost or stuck); this "
                          "rank is not part of the shrunk communicator",
                          by, me),
              by);
}

std::string listText(const std::set<int>& ranks) {
  if (ranks.empty()) return "none";
  std::string s;
  for (int r : ranks) s += fmt::format("{}{}", s.empty() ? "" : ", ", r);
  return s;
}

/// Errors that mean "that rank is gone, stuck or has given up on this exchange".
bool peerFailure(const Error& e) {
  return e.code() == ErrorCode::PeerLost || e.code() == ErrorCode::Timeout ||
         e.code() == ErrorCode::Aborted || e.code() == ErrorCode::ProtocolError;
}

/// What calls on a revoked communicator fail with. Communicator::revoke: Aborted, naming the rank
/// that revoked and its reason. A revoke after a failed call: that failure (its code, the rank
/// at fault first), then who revoked.
Error revokeError(const std::string& domain, int origin, bool here, const std::string& reason,
                  const std::vector<int>& suspects, ErrorCode code) {
  const std::string who = fmt::format("rank {}{}", origin, here ? " (this rank)" : "");
  if (code == ErrorCode::Aborted || suspects.empty()) {
    return Error(ErrorCode::Aborted, fmt::format("{} was revoked by {}: {}", domain, who, reason),
                 origin);
  }
  return Error(code, fmt::format("{} [{} failed so and revoked {}]", reason, who, domain),
               suspects.front());
}

}  // namespace

void core::FaultState::addLost(std::span<const int> ranks, int size) {
  std::lock_guard lk(mu);
  for (int r : ranks) {
    if (r >= 0 && r < size) lost.insert(r);
  }
}

void core::FaultState::revokeFirst(const Error& why, bool interrupt) {
  std::lock_guard lk(revokeMu);
  if (revoked) return;
  revoked = true;
  if (auto ctx = context.lock()) ctx->revoke(why);
  // A thread of this rank blocked in a bootstrap call (comm.bootstrap(), ncclCommSplit) must not
  // wait for bootstrap.timeout: the peers it waits for have stopped using this communicator.
  if (interrupt && bootstrap != nullptr && !bootstrap::interruptCalls(*bootstrap, why)) {
    STRATA_LOG(Debug, "core", "revoke: the {} bootstrap cannot interrupt its calls in progress",
               bootstrap->backend());
  }
}

Communicator::Impl::~Impl() {
  if (scope && !domain.empty()) scope->unlistenRevoke(domain);
  std::lock_guard lk(fault->revokeMu);  // a listener still running finishes with the bootstrap
  fault->bootstrap = nullptr;
}

void Communicator::Impl::listenRevokes() {
  const int n = size;
  scope->listenRevoke(domain, [weak = std::weak_ptr<core::FaultState>(fault), d = domain,
                               n](const watch::Scope::Revoke& r) {
    auto f = weak.lock();
    if (!f) return;
    f->addLost(r.suspects, n);
    // A revoke after a failed call carries that failure's code and culprit, as if this rank
    // had seen it; Communicator::revoke's is Aborted, naming the rank that revoked.
    f->revokeFirst(revokeError(d, r.origin, false, r.reason, r.suspects, r.code), r.interrupt);
  });
}

void Communicator::Impl::revokeHere(const std::string& reason, std::vector<int> suspects,
                                    ErrorCode code, bool interrupt) noexcept {
  try {
    fault->addLost(suspects, size);
    const std::string name = domain.empty() ? std::string("the communicator") : domain;
    fault->revokeFirst(revokeError(name, rank, true, reason, suspects, code), interrupt);
    if (scope && !domain.empty()) {
      watch::Scope::Revoke r{rank, reason, std::move(suspects), code, interrupt};
      scope->deliverRevoke(domain, r);
      scope->broadcastRevoke(domain, r);
    }
  } catch (const std::exception& e) {
    STRATA_LOG(Warn, "core", "revoke: {}", e.what());
  }
}

void Communicator::Impl::afterFailure(const Error& e) noexcept {
  std::vector<int> suspects;
  if (e.code() == ErrorCode::PeerLost && e.peer() >= 0) suspects.push_back(e.peer());
  if (e.code() == ErrorCode::Timeout) {
    const int culprit = watch::lastVerdict().culprit;
    if (culprit >= 0 && culprit != rank) suspects.push_back(culprit);
  }
  if (suspects.empty()) return;  // not a peer's failure that anyone can act on
  fault->addLost(suspects, size);
  if (revokeOnError && !context->revoked()) {
    revokeHere(e.what(), suspects, e.code());
  }
}

void Communicator::revoke(std::string_view reason) {
  impl_->revokeHere(std::string(reason), {}, ErrorCode::Aborted, true);
}

std::optional<Error> Communicator::revoked() const {
  return impl_->context->revoked();
}

std::vector<int> Communicator::lostRanks() const {
  std::lock_guard lk(impl_->fault->mu);
  return {impl_->fault->lost.begin(), impl_->fault->lost.end()};
}

std::unique_ptr<Communicator> Communicator::shrink() {
  std::vector<int> lost = lostRanks();
  return shrink(lost);
}

std::unique_ptr<Communicator> Communicator::shrink(std::span<const int> exclude) {
  Impl& I = *impl_;
  const int n = I.size, me = I.rank;
  std::set<int> out;
  for (int r : exclude) {
    if (r < 0 || r >= n) {
      throw Error(
          ErrorCode::InvalidArgument,
          fmt::format("shrink: rank {} is not a rank of this communicator (0..{})", r, n - 1));
    }
    if (r == me) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("shrink: rank {} excludes itself (excluded ranks do not call "
                              "shrink)",
                              me));
    }
    out.insert(r);
  }
  for (int r : lostRanks()) {
    if (r != me) out.insert(r);
  }
  // Calls still running on this communicator (this rank's other threads, the peers') must end.
  if (!I.context->revoked()) {
    I.revokeHere(fmt::format("rank {} shrinks the communicator (excluding {})", me, listText(out)),
                 {out.begin(), out.end()});
  }
  // A revoke heard on another thread may still be interrupting this rank's bootstrap calls:
  // the agreement's must begin after it.
  I.fault->shrinkBegins();
  const int shrink = I.shrinks++;
  Bootstrap& boot = *I.bootstrap;
  const auto start = std::chrono::steady_clock::now();
  std::optional<Error> last;
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    // The agreement: every survivor sends its excluded set to every other survivor it knows of,
    // and takes the union of what it receives; a rank that does not answer (dead, or silent for
    // bootstrap.timeout) is excluded too. Two rounds, so that what one survivor learnt in the
    // first reaches every other.
    for (int round = 0; round < kRounds; ++round) {
      const int tag = agreeTag(shrink, attempt, round);
      std::vector<int> others;
      for (int p = 0; p < n; ++p) {
        if (p != me && !out.count(p)) others.push_back(p);
      }
      const std::vector<uint8_t> bits = toBits(out, n);
      std::set<int> failed;
      for (int p : others) {
        try {
          boot.send(p, tag, bits.data(), bits.size());
        } catch (const Error& e) {
          if (!peerFailure(e)) throw;
          failed.insert(p);
        }
      }
      std::vector<uint8_t> theirs(bits.size());
      for (int p : others) {
        // Excluded by a set received this round (dead, or stopped: waiting for it would take
        // bootstrap.timeout while the others go on).
        if (failed.count(p) || out.count(p)) continue;
        try {
          boot.recv(p, tag, theirs.data(), theirs.size());
        } catch (const Error& e) {
          if (!peerFailure(e)) throw;
          STRATA_LOG(Info, "core", "shrink: rank {} excluded (agreement round {}): {}", p, round,
                     e.what());
          failed.insert(p);
          continue;
        }
        std::set<int> got = fromBits(theirs, n, p);
        if (got.count(me)) excludedBy(p, me);
        out.insert(got.begin(), got.end());
      }
      out.insert(failed.begin(), failed.end());
    }
    std::vector<int> members;
    for (int p = 0; p < n; ++p) {
      if (!out.count(p)) members.push_back(p);
    }
    // The subset of the survivors; its first exchange checks that every member decided the same
    // set, and its communicator's creation that every member is alive. Either failing starts
    // another attempt with what it found.
    std::shared_ptr<Bootstrap> sub;
    bool excludedHere = false;  // another member excluded this rank: no other attempt
    try {
      bootstrap::SubsetOptions so;
      so.members = members;
      so.tag = subsetTag(shrink, attempt);
      for (int m : members) {
        if (!I.context->sameHost(m)) continue;
        if (m < me) ++so.localRank;
        ++so.localSize;
      }
      so.localSize = std::max(so.localSize, 1);
      sub = bootstrap::subset(I.bootstrap, so);
      const std::vector<uint8_t> bits = toBits(out, n);
      std::vector<uint8_t> all(bits.size() * members.size());
      const size_t mine = static_cast<size_t>(sub->rank());
      std::copy(bits.begin(), bits.end(), all.begin() + static_cast<long>(mine * bits.size()));
      sub->allGather(all.data(), bits.size());
      bool agreed = true;
      for (size_t k = 0; k < members.size(); ++k) {
        std::vector<uint8_t> b(all.begin() + static_cast<long>(k * bits.size()),
                               all.begin() + static_cast<long>((k + 1) * bits.size()));
        std::set<int> got = fromBits(b, n, members[k]);
        if (got.count(me)) {
          excludedHere = true;
          excludedBy(members[k], me);
        }
        if (got != out) agreed = false;
        out.insert(got.begin(), got.end());
      }
      if (!agreed) {
        STRATA_LOG(Info, "core",
                   "shrink attempt {}: the survivors decided different sets; "
                   "again with {} excluded",
                   attempt, listText(out));
        sub->abort(fmt::format("rank {} found different excluded sets in attempt {}", me, attempt));
        last = Error(ErrorCode::ProtocolError,
                     fmt::format("shrink: the survivors decided different sets of excluded ranks "
                                 "in {} attempts (last: {})",
                                 attempt + 1, listText(out)));
        continue;
      }
      std::shared_ptr<Bootstrap> watched =
          bootstrap::watchSubset(bootstrap::sharing(sub), *I.bootstrap, I.config);
      auto comm = Communicator::create(std::move(watched), I.config);
      STRATA_LOG(Info, "core",
                 "shrink: rank {} is rank {} of {} in the new communicator (excluded: {}; {:.3f} "
                 "s, {} attempt(s))",
                 me, comm->rank(), comm->size(), listText(out),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                 attempt + 1);
      return comm;
    } catch (const Error& e) {
      // A member that failed meanwhile (dead, silent, or gave up): another attempt without it.
      if (!peerFailure(e) || excludedHere) throw;
      // The member the error names is excluded when it is lost or silent, not when it only
      // left this attempt (its abort notice).
      const int q = e.peer();
      if ((e.code() == ErrorCode::PeerLost || e.code() == ErrorCode::Timeout) && q >= 0 &&
          q < static_cast<int>(members.size()) && members[q] != me) {
        out.insert(members[q]);
      }
      // Members still waiting in this attempt for this rank learn that it moved on.
      if (sub) {
        sub->abort(fmt::format("rank {} left shrink attempt {}: {}", me, attempt, e.what()));
      }
      STRATA_LOG(Info, "core", "shrink attempt {} failed ({}); again with {} excluded", attempt,
                 e.what(), listText(out));
      last = e;
    }
  }
  throw Error(last->code(),
              fmt::format("shrink: no agreement among the survivors in {} attempts: {}",
                          kMaxAttempts, last->what()),
              last->peer());
}

// ---- grow ----------------------------------------------------------------------------------

namespace {

constexpr std::string_view kInvitationPrefix = "strata-grow:1:";

struct Invitation {
  int oldSize = 0, newSize = 0;
  std::string secret, root;
};

std::string encodeInvitation(const Invitation& v) {
  return fmt::format("{}{}:{}:{}:{}", kInvitationPrefix, v.oldSize, v.newSize, v.secret, v.root);
}

Invitation decodeInvitation(std::string_view text) {
  auto bad = [&](const char* why) {
    return Error(ErrorCode::InvalidArgument,
                 fmt::format("join: '{}' is not a grow invitation ({}; growInvitation() on rank "
                             "0 makes one: strata-grow:1:OLD:NEW:SECRET:HOST:PORT)",
                             text.substr(0, 200), why));
  };
  // As read from a file or an environment variable: surrounding white space is not part of it.
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  if (text.substr(0, kInvitationPrefix.size()) != kInvitationPrefix) throw bad("no prefix");
  std::string_view rest = text.substr(kInvitationPrefix.size());
  std::string_view parts[3];
  for (auto& part : parts) {
    const size_t colon = rest.find(':');
    if (colon == std::string_view::npos) throw bad("too few fields");
    part = rest.substr(0, colon);
    rest = rest.substr(colon + 1);
  }
  Invitation v;
  auto number = [&](std::string_view f) {
    int x = 0;
    auto [end, ec] = std::from_chars(f.data(), f.data() + f.size(), x);
    if (ec != std::errc() || end != f.data() + f.size()) throw bad("a size is not a number");
    return x;
  };
  v.oldSize = number(parts[0]);
  v.newSize = number(parts[1]);
  v.secret = std::string(parts[2]);
  v.root = std::string(rest);
  if (v.oldSize < 1 || v.newSize <= v.oldSize || v.secret.empty() || v.root.empty()) {
    throw bad("sizes, secret or address out of range");
  }
  return v;
}

/// The rank-0 record of a grow, broadcast over the growing communicator's bootstrap.
struct GrowRecord {
  int32_t newSize;
  char secret[80];
  char root[136];
};

}  // namespace

std::string Communicator::growInvitation(int newSize) {
  Impl& I = *impl_;
  if (I.rank != 0) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("growInvitation: rank {} called it; rank 0 makes the invitation (the "
                            "others call only grow())",
                            I.rank));
  }
  if (newSize <= I.size || newSize > (1 << 20)) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("growInvitation: a communicator of {} ranks cannot grow to {}", I.size,
                            newSize));
  }
  I.growListener = std::make_unique<RendezvousListener>(I.config);
  std::array<uint8_t, 24> raw{};
  crypto::randomBytes(raw);
  I.growSecret = crypto::toHex(raw);
  I.growSize = newSize;
  return encodeInvitation({I.size, newSize, I.growSecret, I.growListener->address()});
}

std::unique_ptr<Communicator> Communicator::grow(int newSize) {
  Impl& I = *impl_;
  GrowRecord rec{};
  if (I.rank == 0) {
    if (!I.growListener || I.growSize != newSize) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("grow({}): rank 0 has no invitation for {} ranks; call "
                              "growInvitation({}) first and give it to the newcomers",
                              newSize, newSize, newSize));
    }
    rec.newSize = newSize;
    std::snprintf(rec.secret, sizeof rec.secret, "%s", I.growSecret.c_str());
    std::snprintf(rec.root, sizeof rec.root, "%s", I.growListener->address().c_str());
  }
  I.bootstrap->broadcast(&rec, sizeof rec, 0);
  rec.secret[sizeof rec.secret - 1] = rec.root[sizeof rec.root - 1] = '\0';
  if (rec.newSize != newSize) {
    throw Error(
        ErrorCode::InvalidArgument,
        fmt::format("grow({}): rank 0 grows this communicator to {} ranks", newSize, rec.newSize),
        0);
  }
  ExplicitLaunch launch;
  launch.rank = I.rank;
  launch.size = newSize;
  for (int p = 0; p < I.size; ++p) {
    if (!I.context->sameHost(p)) continue;
    if (p < I.rank) ++launch.localRank;
    ++launch.localSize;
  }
  launch.root = rec.root;
  launch.secret = rec.secret;
  std::unique_ptr<RendezvousListener> listener = std::move(I.growListener);
  I.growSize = 0;
  std::shared_ptr<Bootstrap> boot = createTcpBootstrap(launch, I.config, listener.get());
  return Communicator::create(std::move(boot), I.config);
}

std::unique_ptr<Communicator> Communicator::join(const std::string& invitation, int index,
                                                 const Config& config) {
  const Invitation v = decodeInvitation(invitation);
  if (index < 0 || index >= v.newSize - v.oldSize) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("join: newcomer {} of a grow from {} to {} ranks (0..{})", index,
                            v.oldSize, v.newSize, v.newSize - v.oldSize - 1));
  }
  ExplicitLaunch launch;
  launch.rank = v.oldSize + index;
  launch.size = v.newSize;
  launch.root = v.root;
  launch.secret = v.secret;
  std::shared_ptr<Bootstrap> boot = createTcpBootstrap(launch, config);
  return Communicator::create(std::move(boot), config);
}

}  // namespace strata
