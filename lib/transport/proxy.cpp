// The proxy service behind PortChannels: one thread that drains the FIFO and turns triggers
// into Connection calls.

#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <strata/channel.hpp>
#include <strata/error.hpp>
#include <strata/transport.hpp>

#include "base/log.hpp"

namespace strata {

namespace {

long futex(uint32_t* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
}

}  // namespace

void FifoDeviceHandle::wakeProxy() const noexcept {
  // Pairs with the proxy's sleeping flag: the proxy raises it, rechecks the FIFO, then sleeps
  // on wake; a producer publishes, then reads the flag (both sequentially consistent).
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (__atomic_load_n(sleeping, __ATOMIC_SEQ_CST) != 0) {
    __atomic_fetch_add(wake, 1, __ATOMIC_SEQ_CST);
    futex(wake, FUTEX_WAKE_PRIVATE, 1, nullptr);
  }
}

struct ProxyService::Impl {
  struct Channel {
    std::shared_ptr<Connection> conn;
    RegisteredMemory dst, src, peerFlags;
    uint64_t flagOffset = 0;
    uint64_t outbound = 0;
    size_t state = 0;  ///< index in connectionStates: the channels of one Connection share it
  };
  /// The failure of one Connection: its channels' later triggers are consumed without effect,
  /// while the other connections go on (a peer that is gone must not stop traffic to the rest).
  struct ConnectionState {
    std::atomic<bool> failed{false};
    std::exception_ptr error;  ///< under errorMu
  };
  /// The FIFO's shared words, at the start of its memory block (each on its own cache line).
  struct Control {
    alignas(64) uint64_t head;
    alignas(64) uint64_t tail;
    alignas(64) uint32_t wake;
    uint32_t sleeping;
  };
  uint32_t size;
  double timeout;
  // One page-aligned block, control words then slots, so that a CUDA module can register it as
  // pinned, mapped memory and kernels can push into it (fifoMemory(), fifo(base)).
  void* block = MAP_FAILED;
  size_t blockBytes = 0;
  Control* control = nullptr;
  FifoSlot* slots = nullptr;
  uint64_t& head() { return control->head; }
  uint64_t& tail() { return control->tail; }
  /// Device work in flight that may push (beginDeviceWork): poll, never sleep.
  std::atomic<uint32_t> deviceWork{0};
  std::atomic<uint64_t> sleepCount{0};
  std::vector<Channel> channels;
  /// Fixed once the thread runs (deque: atomics do not move).
  std::deque<ConnectionState> connectionStates;
  std::thread thread;
  std::atomic<bool> stopping{false};
  /// A trigger that names no channel (a corrupt FIFO) stops every later trigger.
  std::atomic<bool> failed{false};
  std::atomic<bool> anyError{false};
  std::atomic<uint64_t> executedCount{0};
  mutable std::mutex errorMu;
  std::exception_ptr error;      ///< the first error of any kind (check())
  std::exception_ptr stopError;  ///< the error that stopped every trigger (failed)

  /// The handle with every address moved from the block to base (the same memory elsewhere).
  FifoDeviceHandle handle(void* base) {
    auto at = [&](void* p) {
      return static_cast<char*>(base) + (static_cast<char*>(p) - static_cast<char*>(block));
    };
    return {reinterpret_cast<FifoSlot*>(at(slots)),
            reinterpret_cast<uint64_t*>(at(&control->head)),
            reinterpret_cast<uint64_t*>(at(&control->tail)),
            reinterpret_cast<uint32_t*>(at(&control->wake)),
            reinterpret_cast<uint32_t*>(at(&control->sleeping)),
            size};
  }
  FifoDeviceHandle handle() { return handle(block); }

  void execute(const ProxyTrigger& t) {
    if (t.channel >= channels.size()) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("proxy trigger for channel {}, but only {} channels exist", t.channel,
                              channels.size()));
    }
    Channel& c = channels[t.channel];
    switch (t.type) {
      case TriggerType::Put:
        c.conn->write(c.dst, t.dstOffset, c.src, t.srcOffset, t.bytes);
        break;
      case TriggerType::PutWithSignal:
        c.conn->write(c.dst, t.dstOffset, c.src, t.srcOffset, t.bytes);
        c.conn->updateAndSync(c.peerFlags, c.flagOffset, ++c.outbound);
        break;
      case TriggerType::Signal:
        c.conn->updateAndSync(c.peerFlags, c.flagOffset, ++c.outbound);
        break;
      case TriggerType::Flush:
        c.conn->flush(timeout);
        break;
      default:
        throw Error(ErrorCode::InvalidArgument,
                    fmt::format("proxy trigger of unknown type {}", static_cast<uint32_t>(t.type)));
    }
  }

  void run() {
    using Clock = std::chrono::steady_clock;
    auto idleSince = Clock::now();
    for (;;) {
      uint64_t& tail = this->tail();
      uint64_t& head = this->head();
      uint32_t& wake = control->wake;
      uint32_t& sleeping = control->sleeping;
      FifoSlot& slot = slots[tail % size];
      if (__atomic_load_n(&slot.seq, __ATOMIC_ACQUIRE) == tail + 1) {
        ProxyTrigger t = slot.trigger;
        ConnectionState* state =
            t.channel < channels.size() ? &connectionStates[channels[t.channel].state] : nullptr;
        if (!failed.load(std::memory_order_relaxed) &&
            !(state && state->failed.load(std::memory_order_relaxed))) {
          try {
            execute(t);
          } catch (...) {
            std::lock_guard<std::mutex> lock(errorMu);
            if (!error) error = std::current_exception();
            if (state) {
              state->error = std::current_exception();
              state->failed.store(true, std::memory_order_release);
            } else {
              stopError = std::current_exception();
              failed.store(true, std::memory_order_release);
            }
            anyError.store(true, std::memory_order_release);
          }
        }
        executedCount.fetch_add(1, std::memory_order_relaxed);
        __atomic_store_n(&tail, tail + 1, __ATOMIC_RELEASE);
        idleSince = Clock::now();
        continue;
      }
      if (stopping.load(std::memory_order_acquire)) {
        if (__atomic_load_n(&head, __ATOMIC_ACQUIRE) == tail) return;
        // A producer reserved a slot but never published it (it died): give up after the
        // timeout rather than hang the shutdown.
        if (timeout > 0 && Clock::now() - idleSince > std::chrono::duration<double>(timeout)) {
          STRATA_LOG(Warn, "proxy",
                     "stopping with {} reserved FIFO slots never published (a producer died?)",
                     __atomic_load_n(&head, __ATOMIC_ACQUIRE) - tail);
          return;
        }
      }
      // Idle: spin briefly, yield for a while, then sleep until a producer wakes us (or 1 ms).
      // While device work may push (a kernel cannot wake us), never sleep: yield instead.
      auto idle = Clock::now() - idleSince;
      if (idle < std::chrono::microseconds(20)) {
        device::spinPause();
      } else if (idle < std::chrono::microseconds(500) ||
                 deviceWork.load(std::memory_order_acquire) != 0) {
        sched_yield();
      } else {
        sleepCount.fetch_add(1, std::memory_order_relaxed);
        uint32_t seen = __atomic_load_n(&wake, __ATOMIC_SEQ_CST);
        __atomic_store_n(&sleeping, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&slot.seq, __ATOMIC_SEQ_CST) != tail + 1 &&
            !stopping.load(std::memory_order_seq_cst)) {
          timespec ts{0, 1'000'000};
          futex(&wake, FUTEX_WAIT_PRIVATE, seen, &ts);
        }
        __atomic_store_n(&sleeping, 0, __ATOMIC_SEQ_CST);
      }
    }
  }
};

ProxyService::ProxyService(uint32_t fifoSize, double timeoutSeconds)
    : impl_(std::make_unique<Impl>()) {
  if (fifoSize == 0) throw Error(ErrorCode::InvalidArgument, "ProxyService: FIFO size 0");
  impl_->size = fifoSize;
  impl_->timeout = timeoutSeconds;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = sizeof(Impl::Control) + sizeof(FifoSlot) * static_cast<size_t>(fifoSize);
  impl_->blockBytes = (bytes + page - 1) / page * page;
  impl_->block =
      mmap(nullptr, impl_->blockBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (impl_->block == MAP_FAILED) {
    throw Error(ErrorCode::SystemError,
                fmt::format("ProxyService: cannot map {} bytes for the FIFO", impl_->blockBytes));
  }
  // Zero pages: every control word 0, every slot's seq 0 (unpublished).
  impl_->control = new (impl_->block) Impl::Control{};
  impl_->slots =
      reinterpret_cast<FifoSlot*>(static_cast<char*>(impl_->block) + sizeof(Impl::Control));
  for (uint32_t i = 0; i < fifoSize; ++i) new (&impl_->slots[i]) FifoSlot{};
}

ProxyService::~ProxyService() {
  stop();
  if (impl_ && impl_->block != MAP_FAILED) munmap(impl_->block, impl_->blockBytes);
}

uint32_t ProxyService::addChannel(std::shared_ptr<Connection> conn, RegisteredMemory dst,
                                  RegisteredMemory src, RegisteredMemory peerFlags,
                                  uint64_t flagOffset) {
  if (impl_->thread.joinable()) {
    throw Error(ErrorCode::InvalidArgument, "ProxyService::addChannel after start()");
  }
  if (!conn || !dst || !src || !peerFlags) {
    throw Error(ErrorCode::InvalidArgument, "ProxyService::addChannel: null connection or memory");
  }
  if (dst.isLocal() || peerFlags.isLocal() || !src.isLocal()) {
    throw Error(ErrorCode::InvalidArgument,
                "ProxyService::addChannel: dst and peerFlags must be the peer's memory (remote "
                "views), src this rank's");
  }
  // The channels of one Connection share its state: find one of them, else add a state.
  size_t sibling = 0;
  while (sibling < impl_->channels.size() && impl_->channels[sibling].conn != conn) ++sibling;
  const size_t state = sibling < impl_->channels.size() ? impl_->channels[sibling].state
                                                        : impl_->connectionStates.size();
  if (state == impl_->connectionStates.size()) impl_->connectionStates.emplace_back();
  impl_->channels.push_back({std::move(conn), std::move(dst), std::move(src), std::move(peerFlags),
                             flagOffset, 0, state});
  return static_cast<uint32_t>(impl_->channels.size() - 1);
}

PortChannel ProxyService::portChannel(uint32_t channel, uint64_t* inbound) {
  if (channel >= impl_->channels.size()) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("ProxyService::portChannel: no channel {}", channel));
  }
  PortChannel p;
  p.fifo = impl_->handle();
  p.channel = channel;
  p.inbound = inbound;
  p.expected = inbound ? device::loadAcquire(inbound) : 0;
  return p;
}

FifoDeviceHandle ProxyService::fifo() noexcept {
  return impl_->handle();
}

std::span<std::byte> ProxyService::fifoMemory() noexcept {
  return {static_cast<std::byte*>(impl_->block), impl_->blockBytes};
}

FifoDeviceHandle ProxyService::fifo(void* mappedBase) noexcept {
  return impl_->handle(mappedBase);
}

void ProxyService::beginDeviceWork() noexcept {
  impl_->deviceWork.fetch_add(1, std::memory_order_acq_rel);
  // A sleeping proxy would not notice: wake it, and from now on it polls.
  __atomic_fetch_add(&impl_->control->wake, 1, __ATOMIC_SEQ_CST);
  futex(&impl_->control->wake, FUTEX_WAKE_PRIVATE, 1, nullptr);
}

void ProxyService::endDeviceWork() noexcept {
  impl_->deviceWork.fetch_sub(1, std::memory_order_acq_rel);
}

uint64_t ProxyService::sleeps() const noexcept {
  return impl_->sleepCount.load(std::memory_order_relaxed);
}

void ProxyService::start() {
  if (impl_->thread.joinable()) return;
  impl_->stopping = false;
  impl_->thread = std::thread([this] { impl_->run(); });
}

void ProxyService::stop() noexcept {
  if (!impl_ || !impl_->thread.joinable()) return;
  impl_->stopping.store(true, std::memory_order_seq_cst);
  __atomic_fetch_add(&impl_->control->wake, 1, __ATOMIC_SEQ_CST);
  futex(&impl_->control->wake, FUTEX_WAKE_PRIVATE, 1, nullptr);
  impl_->thread.join();
}

void ProxyService::check() const {
  if (!impl_->anyError.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(impl_->errorMu);
  std::rethrow_exception(impl_->error);
}

void ProxyService::check(uint32_t channel) const {
  if (channel >= impl_->channels.size()) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("ProxyService::check: no channel {}", channel));
  }
  if (!impl_->anyError.load(std::memory_order_acquire)) return;
  const Impl::ConnectionState& state = impl_->connectionStates[impl_->channels[channel].state];
  if (impl_->failed.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(impl_->errorMu);
    std::rethrow_exception(impl_->stopError);
  }
  if (state.failed.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(impl_->errorMu);
    std::rethrow_exception(state.error);
  }
}

uint64_t ProxyService::executed() const noexcept {
  return impl_->executedCount.load(std::memory_order_relaxed);
}

}  // namespace strata
