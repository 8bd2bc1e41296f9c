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
#include "base/process.hpp"

namespace strata {

namespace {

long futex(uint32_t* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
}

}  // namespace

void FifoDeviceHandle::wakeProxy() const noexcept {
  if (sleeping == nullptr || wake == nullptr) return;  // a kernel's ring: the proxy polls it
  // Pairs with the proxy's sleeping flag: the proxy raises it, rechecks the FIFO, then sleeps
  // on wake; a producer publishes, then reads the flag (both sequentially consistent).
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (__atomic_load_n(sleeping, __ATOMIC_SEQ_CST) != 0) {
    __atomic_fetch_add(wake, 1, __ATOMIC_SEQ_CST);
    futex(wake, FUTEX_WAKE_PRIVATE, 1, nullptr);
  }
}

struct ProxyService::Impl {
  /// The failure of one Connection: its channels' later triggers are consumed without effect,
  /// while the other connections go on (a peer that is gone must not stop traffic to the rest).
  struct ConnectionState {
    std::atomic<bool> failed{false};
    std::exception_ptr error;  ///< under errorMu
  };
  struct Channel {
    std::shared_ptr<Connection> conn;
    RegisteredMemory dst, src, peerFlags;
    uint64_t flagOffset = 0;
    uint64_t outbound = 0;
    ConnectionState* state = nullptr;  ///< shared by the channels of one Connection
  };
  /// The FIFO's shared words, at the start of its memory block (each on its own cache line):
  /// the host ring's head and tail cache (its producers' memory), both rings' tails, the futex.
  struct Control {
    alignas(64) uint64_t hostHead;
    uint64_t hostTailCache;
    alignas(64) uint64_t hostTail;
    alignas(64) uint64_t deviceTail;
    alignas(64) uint32_t wake;
    uint32_t sleeping;
  };
  /// One ring as the proxy sees it: entries, its tail, and (host ring) its head.
  struct Ring {
    PackedTrigger* triggers = nullptr;
    uint64_t* tail = nullptr;
    const uint64_t* head = nullptr;  ///< null for the device ring (its head is device memory)
  };
  uint32_t size;
  double timeout;
  // One page-aligned block, control words then the host ring then the device ring, so that a
  // CUDA module can register it as pinned, mapped memory and kernels can push into it
  // (fifoMemory(), fifo(base, words)).
  void* block = MAP_FAILED;
  size_t blockBytes = 0;
  Control* control = nullptr;
  Ring rings[2];  ///< host producers, kernels
  /// Device work in flight that may push (beginDeviceWork): poll, then nap, never sleep long.
  std::atomic<uint32_t> deviceWork{0};
  std::atomic<uint64_t> sleepCount{0};
  std::atomic<uint64_t> napCount{0};  ///< short timed sleeps while device work is registered
  /// Channels may be added while the thread runs (a communicator connects a new peer on its
  /// first send/recv): fixed slots, published by channelCount (release); the thread reads
  /// only the slots below it. addMu orders the adders.
  std::unique_ptr<std::unique_ptr<Channel>[]> channels =
      std::make_unique<std::unique_ptr<Channel>[]>(kTriggerNoChannel);
  std::atomic<size_t> channelCount{0};
  std::mutex addMu;
  /// Under addMu (deque: a state never moves once added).
  std::deque<ConnectionState> connectionStates;
  Channel* channel(uint32_t i) const {
    return i < channelCount.load(std::memory_order_acquire) ? channels[i].get() : nullptr;
  }
  std::thread thread;
  std::vector<int> cpus;  ///< pinTo: where the thread runs (empty: unbound)
  std::atomic<bool> stopping{false};
  /// A trigger that names no channel (a corrupt FIFO) stops every later trigger.
  std::atomic<bool> failed{false};
  std::atomic<bool> anyError{false};
  std::atomic<uint64_t> executedCount{0};
  mutable std::mutex errorMu;
  std::exception_ptr error;      ///< the first error of any kind (check())
  std::exception_ptr stopError;  ///< the error that stopped every trigger (failed)

  /// p moved from the block to base (the same memory seen elsewhere).
  template <typename T>
  T* at(void* base, T* p) {
    return reinterpret_cast<T*>(static_cast<char*>(base) +
                                (reinterpret_cast<char*>(p) - static_cast<char*>(block)));
  }
  FifoDeviceHandle hostHandle() {
    return {rings[0].triggers,
            &control->hostHead,
            &control->hostTailCache,
            &control->hostTail,
            &control->wake,
            &control->sleeping,
            size};
  }
  FifoDeviceHandle deviceHandle(void* base, uint64_t* words) {
    return {at(base, rings[1].triggers),
            words,
            words + 1,
            at(base, &control->deviceTail),
            nullptr,
            nullptr,
            size};
  }

  /// The next entry of a ring, if published (both halves).
  bool next(const Ring& r, ProxyTrigger* t) const {
    const PackedTrigger& e = r.triggers[*r.tail % size];
    PackedTrigger seen;
    seen.fst = __atomic_load_n(&e.fst, __ATOMIC_ACQUIRE);
    seen.snd = __atomic_load_n(&e.snd, __ATOMIC_ACQUIRE);
    return unpackTrigger(seen, t);
  }
  bool anyPublished() const {
    ProxyTrigger t;
    return next(rings[0], &t) || next(rings[1], &t);
  }

  void execute(const ProxyTrigger& t) {
    if (t.type == TriggerType::Invalid) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("proxy trigger for channel {} did not fit a FIFO entry (offsets up "
                              "to {}, sizes up to {} bytes per trigger, channels below {})",
                              t.channel, kTriggerMaxOffset, kTriggerMaxBytes, kTriggerNoChannel));
    }
    Channel* found = channel(t.channel);
    if (found == nullptr) {
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("proxy trigger for channel {}, but only {} channels exist", t.channel,
                              channelCount.load(std::memory_order_acquire)));
    }
    Channel& c = *found;
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

  /// Executes (or, on a failed Connection, skips) one trigger, then frees its slot: the entry
  /// zeroed before tail moves past it, so a producer never writes a slot the proxy still reads.
  void consume(Ring& r, const ProxyTrigger& t) {
    const Channel* c = channel(t.channel);
    ConnectionState* state = c != nullptr ? c->state : nullptr;
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
    const uint64_t tail = *r.tail;
    PackedTrigger& e = r.triggers[tail % size];
    __atomic_store_n(&e.fst, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e.snd, 0, __ATOMIC_RELAXED);
    __atomic_store_n(r.tail, tail + 1, __ATOMIC_RELEASE);
  }

  void run() {
    process::startThread("strata-proxy", cpus, "proxy", "the proxy thread");
    using Clock = std::chrono::steady_clock;
    auto idleSince = Clock::now();
    for (;;) {
      // One trigger from each ring per turn: neither kind of producer starves the other.
      bool any = false;
      for (Ring& r : rings) {
        ProxyTrigger t;
        if (next(r, &t)) {
          consume(r, t);
          any = true;
        }
      }
      if (any) {
        idleSince = Clock::now();
        continue;
      }
      uint32_t& wake = control->wake;
      uint32_t& sleeping = control->sleeping;
      if (stopping.load(std::memory_order_acquire)) {
        // The device ring's producers finished with their work (endDeviceWork); the host
        // ring's head says whether a host producer still owes a slot.
        const uint64_t owed = __atomic_load_n(rings[0].head, __ATOMIC_ACQUIRE) - *rings[0].tail;
        if (owed == 0) return;
        // A producer reserved a slot but never published it (it died): give up after the
        // timeout rather than hang the shutdown.
        if (timeout > 0 && Clock::now() - idleSince > std::chrono::duration<double>(timeout)) {
          STRATA_LOG(Warn, "proxy",
                     "stopping with {} reserved FIFO slots never published (a producer died?)",
                     owed);
          return;
        }
      }
      // Idle: spin briefly, yield for a while, then sleep until a producer wakes us (or 1 ms).
      // While device work may push, a kernel cannot wake us: yield for 2 ms after the last
      // entry (the pushes of one call come microseconds apart), then nap, longer the longer
      // the pause (50 us up to 20 ms idle, 200 us up to 200 ms, then 1 ms), so that a
      // communicator between calls costs a few percent of a core instead of one, and the first
      // push after a pause waits at most one nap (plus the timer's slack).
      constexpr auto kDeviceBusy = std::chrono::milliseconds(2);
      auto idle = Clock::now() - idleSince;
      const long deviceNapNs = idle < std::chrono::milliseconds(20)    ? 50'000
                               : idle < std::chrono::milliseconds(200) ? 200'000
                                                                       : 1'000'000;
      const bool device = deviceWork.load(std::memory_order_acquire) != 0;
      if (idle < std::chrono::microseconds(20)) {
        device::spinPause();
      } else if (idle < std::chrono::microseconds(500) || (device && idle < kDeviceBusy)) {
        sched_yield();
      } else {
        (device ? napCount : sleepCount).fetch_add(1, std::memory_order_relaxed);
        uint32_t seen = __atomic_load_n(&wake, __ATOMIC_SEQ_CST);
        __atomic_store_n(&sleeping, 1, __ATOMIC_SEQ_CST);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (!anyPublished() && !stopping.load(std::memory_order_seq_cst)) {
          timespec ts{0, device ? deviceNapNs : 1'000'000};
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
  const size_t ring = sizeof(PackedTrigger) * static_cast<size_t>(fifoSize);
  const size_t bytes = sizeof(Impl::Control) + 2 * ring;
  impl_->blockBytes = (bytes + page - 1) / page * page;
  impl_->block =
      mmap(nullptr, impl_->blockBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (impl_->block == MAP_FAILED) {
    throw Error(ErrorCode::SystemError,
                fmt::format("ProxyService: cannot map {} bytes for the FIFO", impl_->blockBytes));
  }
  // Zero pages: every control word 0, every entry unpublished.
  impl_->control = new (impl_->block) Impl::Control{};
  char* entries = static_cast<char*>(impl_->block) + sizeof(Impl::Control);
  for (int r = 0; r < 2; ++r) {
    auto* t = reinterpret_cast<PackedTrigger*>(entries + static_cast<size_t>(r) * ring);
    for (uint32_t i = 0; i < fifoSize; ++i) new (&t[i]) PackedTrigger{};
    impl_->rings[r].triggers = t;
  }
  impl_->rings[0].tail = &impl_->control->hostTail;
  impl_->rings[0].head = &impl_->control->hostHead;
  impl_->rings[1].tail = &impl_->control->deviceTail;
}

ProxyService::~ProxyService() {
  stop();
  if (impl_ && impl_->block != MAP_FAILED) munmap(impl_->block, impl_->blockBytes);
}

uint32_t ProxyService::addChannel(std::shared_ptr<Connection> conn, RegisteredMemory dst,
                                  RegisteredMemory src, RegisteredMemory peerFlags,
                                  uint64_t flagOffset) {
  if (!conn || !dst || !src || !peerFlags) {
    throw Error(ErrorCode::InvalidArgument, "ProxyService::addChannel: null connection or memory");
  }
  if (dst.isLocal() || peerFlags.isLocal() || !src.isLocal()) {
    throw Error(ErrorCode::InvalidArgument,
                "ProxyService::addChannel: dst and peerFlags must be the peer's memory (remote "
                "views), src this rank's");
  }
  std::lock_guard<std::mutex> lock(impl_->addMu);
  const size_t count = impl_->channelCount.load(std::memory_order_relaxed);
  if (count >= kTriggerNoChannel) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("ProxyService::addChannel: {} channels already, the most a FIFO entry "
                            "can name",
                            count));
  }
  // The channels of one Connection share its state: find one of them, else add a state.
  Impl::ConnectionState* state = nullptr;
  for (size_t i = 0; i < count && state == nullptr; ++i) {
    if (impl_->channels[i]->conn == conn) state = impl_->channels[i]->state;
  }
  if (state == nullptr) state = &impl_->connectionStates.emplace_back();
  impl_->channels[count] = std::make_unique<Impl::Channel>(Impl::Channel{
      std::move(conn), std::move(dst), std::move(src), std::move(peerFlags), flagOffset, 0, state});
  impl_->channelCount.store(count + 1, std::memory_order_release);
  return static_cast<uint32_t>(count);
}

PortChannel ProxyService::portChannel(uint32_t channel, uint64_t* inbound, uint64_t* expected) {
  if (impl_->channel(channel) == nullptr) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("ProxyService::portChannel: no channel {}", channel));
  }
  if (!inbound || !expected) {
    throw Error(ErrorCode::InvalidArgument,
                "ProxyService::portChannel: a channel needs its inbound counter and the word "
                "that counts the signals consumed (expected)");
  }
  PortChannel p;
  p.fifo = impl_->hostHandle();
  p.channel = channel;
  p.inbound = inbound;
  p.expected = expected;
  return p;
}

FifoDeviceHandle ProxyService::fifo() noexcept {
  return impl_->hostHandle();
}

std::span<std::byte> ProxyService::fifoMemory() noexcept {
  return {static_cast<std::byte*>(impl_->block), impl_->blockBytes};
}

FifoDeviceHandle ProxyService::fifo(void* mappedBase, uint64_t* producerWords) {
  if (!mappedBase || !producerWords || reinterpret_cast<uintptr_t>(producerWords) % 8 != 0) {
    throw Error(ErrorCode::InvalidArgument,
                "ProxyService::fifo: a kernel's ring needs the device address of the FIFO block "
                "and two 8-byte-aligned words of device memory for its head and tail cache");
  }
  return impl_->deviceHandle(mappedBase, producerWords);
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

uint64_t ProxyService::naps() const noexcept {
  return impl_->napCount.load(std::memory_order_relaxed);
}

void ProxyService::pinTo(std::vector<int> cpus) {
  impl_->cpus = std::move(cpus);
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
  const Impl::Channel* c = impl_->channel(channel);
  if (c == nullptr) {
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("ProxyService::check: no channel {}", channel));
  }
  if (!impl_->anyError.load(std::memory_order_acquire)) return;
  const Impl::ConnectionState& state = *c->state;
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
