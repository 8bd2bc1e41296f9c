#include "bootstrap/watched.hpp"

#include <string_view>

#include <strata/error.hpp>

#include "base/config_keys.hpp"
#include "launch/contract.hpp"
#include "mesh/peer_mesh.hpp"
#include "watch/watch.hpp"

namespace strata::bootstrap {

namespace {

class Watched final : public Bootstrap, public mesh::Interruptible {
 public:
  Watched(std::unique_ptr<Bootstrap> inner, std::shared_ptr<watch::Scope> scope)
      : inner_(std::move(inner)), scope_(std::move(scope)) {}
  ~Watched() override {
    watch::close(*scope_);
    inner_.reset();
  }
  std::string_view backend() const noexcept override { return inner_->backend(); }
  int rank() const noexcept override { return inner_->rank(); }
  int size() const noexcept override { return inner_->size(); }
  int localRank() const noexcept override { return inner_->localRank(); }
  int localSize() const noexcept override { return inner_->localSize(); }
  void send(int peer, int tag, const void* data, size_t bytes) override {
    watch::Call c(scope_, "bootstrap", "send", 0);
    run([&] { inner_->send(peer, tag, data, bytes); });
  }
  void recv(int peer, int tag, void* data, size_t bytes) override {
    watch::Call c(scope_, "bootstrap", "recv", 0);
    run([&] { inner_->recv(peer, tag, data, bytes); });
  }
  void allGather(void* data, size_t bytesPerRank) override {
    watch::Call c(scope_, "bootstrap", "allGather", scope_->nextBootstrapSeq());
    run([&] { inner_->allGather(data, bytesPerRank); });
  }
  void broadcast(void* data, size_t bytes, int root) override {
    watch::Call c(scope_, "bootstrap", "broadcast", scope_->nextBootstrapSeq());
    run([&] { inner_->broadcast(data, bytes, root); });
  }
  void barrier() override {
    watch::Call c(scope_, "bootstrap", "barrier", scope_->nextBootstrapSeq());
    run([&] { inner_->barrier(); });
  }
  void abort(std::string_view reason) noexcept override { inner_->abort(reason); }
  bool interruptCalls(const Error& why) noexcept override {
    return bootstrap::interruptCalls(*inner_, why);
  }
  mesh::InterruptKey interruptKey() const noexcept override {
    return bootstrap::interruptKey(*inner_);
  }

  Bootstrap& inner() { return *inner_; }
  const std::shared_ptr<watch::Scope>& scope() const { return scope_; }

 private:
  template <class F>
  void run(F&& f) {
    try {
      f();
    } catch (const mesh::Interrupted&) {
      throw;  // a revoke's error, not this bootstrap's failure
    } catch (const mesh::SizeMismatch&) {
      throw;  // the sender is known and alive: its call differs from this one
    } catch (const Error& e) {
      // A peer that closed its bootstrap because a call of its own failed is not the cause
      // either: it waited for someone too.
      if (e.code() == ErrorCode::Timeout || e.code() == ErrorCode::ProtocolError ||
          (e.code() == ErrorCode::PeerLost &&
           std::string_view(e.what()).find("after a call of its own failed") !=
               std::string_view::npos)) {
        throw watch::diagnose(e);
      }
      throw;
    }
  }
  std::unique_ptr<Bootstrap> inner_;
  std::shared_ptr<watch::Scope> scope_;
};

bool watched(const Bootstrap* inner, const Config& config) {
  return inner && inner->size() >= 2 && config::getBool(config, "watch.enabled");
}

}  // namespace

std::unique_ptr<Bootstrap> attachWatch(std::unique_ptr<Bootstrap> inner, const Config& config) {
  if (!watched(inner.get(), config)) return inner;
  return attachWatch(std::move(inner), config, detectLaunch(config));
}

std::unique_ptr<Bootstrap> attachWatch(std::unique_ptr<Bootstrap> inner, const Config& config,
                                       const LaunchInfo& launch) {
  if (!watched(inner.get(), config)) return inner;
  watch::OpenOptions o;
  o.rank = inner->rank();
  o.size = inner->size();
  o.secret = launch.secret;
  o.interface = config::getString(config, "bootstrap.tcp.interface");
  o.rootHint = launch.root;
  o.queryTimeout = config::getDouble(config, "watch.query_timeout");
  Bootstrap* b = inner.get();
  auto scope = watch::open(o, [b](void* data, size_t bytes) { b->allGather(data, bytes); });
  return std::make_unique<Watched>(std::move(inner), std::move(scope));
}

bool interruptCalls(Bootstrap& b, const Error& why) noexcept {
  auto* i = dynamic_cast<mesh::Interruptible*>(&b);
  return i != nullptr && i->interruptCalls(why);
}

mesh::InterruptKey interruptKey(const Bootstrap& b) noexcept {
  auto* i = dynamic_cast<const mesh::Interruptible*>(&b);
  return i != nullptr ? i->interruptKey() : mesh::InterruptKey{};
}

Bootstrap& unwrap(Bootstrap& b) {
  if (auto* w = dynamic_cast<Watched*>(&b)) return w->inner();
  return b;
}

std::shared_ptr<watch::Scope> scopeOf(const Bootstrap* b) {
  if (auto* w = dynamic_cast<const Watched*>(b)) return w->scope();
  return nullptr;
}

}  // namespace strata::bootstrap
