// The subset bootstrap (bootstrap/subset.hpp): a view over some ranks of a parent bootstrap.

#include "bootstrap/subset.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "bootstrap/watched.hpp"
#include "launch/contract.hpp"
#include "mesh/peer_mesh.hpp"

namespace strata::bootstrap {

namespace {

// Subset tags below zero are the subset's own (collectives, abort); a user's are >= 0.
constexpr int32_t kTagAllGather = -2;
constexpr int32_t kTagBroadcast = -3;
constexpr int32_t kTagAbort = -9;
/// The largest message a subset carries (as the tcp bootstrap's default bootstrap.max_message).
constexpr uint64_t kMaxMessage = 1ull << 30;

struct Header {
  int32_t tag;
  uint32_t zero;
  uint64_t bytes;
};
static_assert(sizeof(Header) == 16);

class Subset final : public Bootstrap, public mesh::Interruptible {
 public:
  Subset(std::shared_ptr<Bootstrap> parent, SubsetOptions o)
      : parent_(std::move(parent)), o_(std::move(o)), peers_(o_.members.size()) {
    rank_ = static_cast<int>(std::find(o_.members.begin(), o_.members.end(), parent_->rank()) -
                             o_.members.begin());
  }
  std::string_view backend() const noexcept override { return parent_->backend(); }
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return static_cast<int>(o_.members.size()); }
  int localRank() const noexcept override { return o_.localRank; }
  int localSize() const noexcept override { return o_.localSize; }

  void send(int peer, int tag, const void* data, size_t bytes) override {
    mesh::CallScope call(key_);  // one call: its parent calls share it
    checkPeer(peer, "send");
    checkTag(tag, "send");
    sendTagged(peer, tag, data, bytes);
  }
  void recv(int peer, int tag, void* data, size_t bytes) override {
    mesh::CallScope call(key_);  // one call: its parent calls share it
    checkPeer(peer, "recv");
    checkTag(tag, "recv");
    recvTagged(peer, tag, data, bytes);
  }
  void allGather(void* data, size_t bytesPerRank) override {
    mesh::CallScope call(key_);  // one call: its parent calls share it
    checkAborted();
    auto* p = static_cast<char*>(data);
    const int n = size();
    for (int q = 0; q < n; ++q) {
      if (q != rank_) sendTagged(q, kTagAllGather, p + bytesPerRank * rank_, bytesPerRank);
    }
    for (int q = 0; q < n; ++q) {
      if (q != rank_) recvTagged(q, kTagAllGather, p + bytesPerRank * q, bytesPerRank);
    }
  }
  void broadcast(void* data, size_t bytes, int root) override {
    mesh::CallScope call(key_);  // one call: its parent calls share it
    checkAborted();
    if (root < 0 || root >= size()) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("broadcast: root {} is not a rank of this bootstrap (0..{})", root,
                              size() - 1));
    }
    if (root == rank_) {
      for (int q = 0; q < size(); ++q) {
        if (q != rank_) sendTagged(q, kTagBroadcast, data, bytes);
      }
    } else {
      recvTagged(root, kTagBroadcast, data, bytes);
    }
  }
  void barrier() override {
    std::vector<char> all(o_.members.size(), 0);
    allGather(all.data(), 1);
  }
  bool interruptCalls(const Error& why) noexcept override {
    return bootstrap::interruptCalls(*parent_, why);
  }
  mesh::InterruptKey interruptKey() const noexcept override {
    return bootstrap::interruptKey(*parent_);
  }
  void abort(std::string_view reason) noexcept override {
    // Told once, also after a member's notice aborted it here: a member that waits for this
    // rank learns it only from this rank.
    if (told_.exchange(true)) return;
    try {
      {
        std::lock_guard lk(abortMu_);
        if (!aborted_.load(std::memory_order_relaxed)) {
          abortOrigin_ = rank_;
          abortReason_ = std::string(reason);
        }
      }
      aborted_.store(true, std::memory_order_release);
      for (int q = 0; q < size(); ++q) {
        if (q == rank_) continue;
        try {
          sendRaw(q, kTagAbort, reason.data(), reason.size());
        } catch (const std::exception&) {
        }
      }
    } catch (...) {
    }
  }

 private:
  struct Peer {
    std::mutex sendMu, recvMu;
    std::map<int32_t, std::deque<std::vector<char>>> early;  ///< under recvMu
    /// A header whose payload a call did not get (an interrupt ended it): the next reads it.
    std::optional<Header> partial;  ///< under recvMu
  };

  void checkPeer(int peer, const char* op) const {
    if (peer < 0 || peer >= size() || peer == rank_) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("{}: peer {} is not another rank of this bootstrap (0..{}, this "
                              "rank is {})",
                              op, peer, size() - 1, rank_));
    }
  }
  static void checkTag(int tag, const char* op) {
    if (tag < 0) throw Error(ErrorCode::InvalidArgument, fmt::format("{}: tag {} < 0", op, tag));
  }
  void checkAborted() {
    if (!aborted_.load(std::memory_order_acquire)) return;
    std::lock_guard lk(abortMu_);
    throw Error(ErrorCode::Aborted,
                abortOrigin_ == rank_
                    ? fmt::format("this rank aborted the bootstrap: {}", abortReason_)
                    : fmt::format("rank {} (rank {} of the parent) aborted the bootstrap: {}",
                                  abortOrigin_, o_.members[abortOrigin_], abortReason_),
                abortOrigin_);
  }
  /// A parent error names parent ranks: name the subset's rank as well.
  [[noreturn]] void rethrow(const Error& e, int peer) const {
    auto it = std::find(o_.members.begin(), o_.members.end(), e.peer());
    const int named = it == o_.members.end() ? -1 : static_cast<int>(it - o_.members.begin());
    throw Error(e.code(),
                fmt::format("{} (rank {} of this shrunk bootstrap is rank {} of its parent)",
                            e.what(), peer, o_.members[peer]),
                named);
  }

  void sendRaw(int peer, int32_t tag, const void* data, size_t bytes) {
    Peer& p = peers_[peer];
    std::lock_guard lk(p.sendMu);
    Header h{tag, 0, bytes};
    const int to = o_.members[peer];
    parent_->send(to, o_.tag, &h, sizeof h);
    if (bytes > 0) parent_->send(to, o_.tag, data, bytes);
  }
  void sendTagged(int peer, int32_t tag, const void* data, size_t bytes) {
    checkAborted();
    try {
      sendRaw(peer, tag, data, bytes);
    } catch (const mesh::Interrupted&) {
      throw;  // the revoke's error, in the revoked communicator's numbering
    } catch (const Error& e) {
      rethrow(e, peer);
    }
  }
  void recvTagged(int peer, int32_t tag, void* data, size_t bytes) {
    checkAborted();
    Peer& p = peers_[peer];
    std::lock_guard lk(p.recvMu);
    auto take = [&](const std::vector<char>& m) {
      if (m.size() != bytes) {
        throw mesh::SizeMismatch(
            ErrorCode::ProtocolError,
            fmt::format("recv from rank {} (tag {}): expected {} bytes, the peer sent {}", peer,
                        tag, bytes, m.size()),
            peer);
      }
      if (bytes > 0) std::memcpy(data, m.data(), bytes);
    };
    auto& queue = p.early[tag];
    if (!queue.empty()) {
      std::vector<char> m = std::move(queue.front());
      queue.pop_front();
      take(m);
      return;
    }
    const int from = o_.members[peer];
    try {
      for (;;) {
        Header h{};
        if (p.partial) {
          h = *p.partial;
          p.partial.reset();
        } else {
          parent_->recv(from, o_.tag, &h, sizeof h);
          if (h.zero != 0 || h.bytes > kMaxMessage) {
            throw Error(ErrorCode::ProtocolError,
                        fmt::format("rank {} sent a malformed subset header (tag {}, {} bytes)",
                                    peer, h.tag, h.bytes),
                        peer);
          }
        }
        std::vector<char> m(h.bytes);
        if (h.bytes > 0) {
          try {
            parent_->recv(from, o_.tag, m.data(), m.size());
          } catch (...) {
            p.partial = h;  // the stream stays in step for the next call
            throw;
          }
        }
        if (h.tag == kTagAbort) {
          {
            std::lock_guard alk(abortMu_);
            if (!aborted_.load(std::memory_order_relaxed)) {
              abortOrigin_ = peer;
              abortReason_.assign(m.begin(), m.end());
            }
          }
          aborted_.store(true, std::memory_order_release);
          checkAborted();
        }
        if (h.tag == tag) {
          take(m);
          return;
        }
        p.early[h.tag].push_back(std::move(m));
      }
    } catch (const mesh::Interrupted&) {
      throw;
    } catch (const Error& e) {
      if (e.code() == ErrorCode::Aborted || e.code() == ErrorCode::InvalidArgument ||
          (e.code() == ErrorCode::ProtocolError && e.peer() == peer)) {
        throw;
      }
      rethrow(e, peer);
    }
  }

  std::shared_ptr<Bootstrap> parent_;
  mesh::InterruptKey key_ = bootstrap::interruptKey(*parent_);
  SubsetOptions o_;
  int rank_ = -1;
  std::vector<Peer> peers_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> told_{false};  ///< this rank sent its abort notices
  std::mutex abortMu_;
  int abortOrigin_ = -1;
  std::string abortReason_;
};

/// Forwards every call to a bootstrap it shares (sharing()).
class Sharing final : public Bootstrap, public mesh::Interruptible {
 public:
  explicit Sharing(std::shared_ptr<Bootstrap> b) : b_(std::move(b)) {}
  std::string_view backend() const noexcept override { return b_->backend(); }
  int rank() const noexcept override { return b_->rank(); }
  int size() const noexcept override { return b_->size(); }
  int localRank() const noexcept override { return b_->localRank(); }
  int localSize() const noexcept override { return b_->localSize(); }
  void send(int peer, int tag, const void* data, size_t bytes) override {
    b_->send(peer, tag, data, bytes);
  }
  void recv(int peer, int tag, void* data, size_t bytes) override {
    b_->recv(peer, tag, data, bytes);
  }
  void allGather(void* data, size_t bytesPerRank) override { b_->allGather(data, bytesPerRank); }
  void broadcast(void* data, size_t bytes, int root) override { b_->broadcast(data, bytes, root); }
  void barrier() override { b_->barrier(); }
  void abort(std::string_view reason) noexcept override { b_->abort(reason); }
  bool interruptCalls(const Error& why) noexcept override {
    return bootstrap::interruptCalls(*b_, why);
  }
  mesh::InterruptKey interruptKey() const noexcept override { return bootstrap::interruptKey(*b_); }

 private:
  std::shared_ptr<Bootstrap> b_;
};

}  // namespace

std::unique_ptr<Bootstrap> sharing(std::shared_ptr<Bootstrap> b) {
  return std::make_unique<Sharing>(std::move(b));
}

std::unique_ptr<Bootstrap> subset(std::shared_ptr<Bootstrap> parent, SubsetOptions o) {
  if (!parent) throw Error(ErrorCode::InvalidArgument, "subset bootstrap: null parent");
  const int n = parent->size();
  bool sorted = std::is_sorted(o.members.begin(), o.members.end()) &&
                std::adjacent_find(o.members.begin(), o.members.end()) == o.members.end();
  bool inRange = !o.members.empty() && o.members.front() >= 0 && o.members.back() < n;
  bool mine = std::find(o.members.begin(), o.members.end(), parent->rank()) != o.members.end();
  if (!sorted || !inRange || !mine || o.tag < 0 || o.localSize < 1 || o.localRank < 0 ||
      o.localRank >= o.localSize) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("subset bootstrap: {} members of {} ranks (ascending, distinct, this "
                            "rank {} among them), tag {}, local rank {} of {}",
                            o.members.size(), n, parent->rank(), o.tag, o.localRank, o.localSize));
  }
  return std::make_unique<Subset>(std::move(parent), std::move(o));
}

std::unique_ptr<Bootstrap> watchSubset(std::unique_ptr<Bootstrap> sub, const Bootstrap& parent,
                                       const Config& config) {
  LaunchInfo launch;
  launch.rank = sub->rank();
  launch.size = sub->size();
  launch.localRank = sub->localRank();
  launch.localSize = sub->localSize();
  launch.launcher = kExplicitLauncher;
  // Where the parent's status port listens: the subset's takes the same interface.
  if (auto scope = scopeOf(&parent)) launch.root = scope->statusAddress();
  // No job secret: the subset's rank 0 makes one for the status ports and sends it over the
  // subset (authenticated by the parent's connections).
  return attachWatch(std::move(sub), config, launch);
}

}  // namespace strata::bootstrap
