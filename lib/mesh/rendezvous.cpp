#include "mesh/rendezvous.hpp"

#include <poll.h>

#include <list>
#include <thread>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/log.hpp"
#include "base/wire.hpp"
#include "net/handshake.hpp"

namespace strata::rendezvous {
namespace {

constexpr uint16_t kRejectVersion = 1;
constexpr size_t kMaxMessage = 4096;

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) {
    s += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  if (ranks.size() > 16) s += fmt::format(" and {} more", ranks.size() - 16);
  return s;
}

}  // namespace

std::vector<uint8_t> encodeReject(const std::string& backend, const std::string& message,
                                  bool timedOut) {
  wire::Writer w;
  w.str(backend).str(message.substr(0, kMaxMessage)).u8(timedOut ? 1 : 0);
  return wire::encodeRecord(kRejectKind, kRejectVersion, w.data());
}

void throwReject(std::span<const uint8_t> rec, int server) {
  auto d = wire::decodeRecord(rec, kRejectKind, kRejectVersion, kMaxMessage + 512,
                              "rendezvous reject record");
  wire::Reader r(d.body, "rendezvous reject record");
  std::string backend = r.str(64);
  std::string message = r.str(kMaxMessage);
  bool timedOut = r.u8() != 0;
  r.expectEnd();
  throw Error(
      timedOut ? ErrorCode::Timeout : ErrorCode::InvalidConfig,
      fmt::format("rank {} ({} backend) failed the rendezvous: {}", server, backend, message),
      server);
}

std::string backendOfKind(uint16_t kind) {
  switch (kind) {
    case 10:
      return "tcp";
    case 30:
      return "ucx";
    default:
      return fmt::format("unknown (record kind {})", kind);
  }
}

std::string timeoutMessage(const std::string& root, double seconds, int count, int size,
                           const std::vector<int>& missing) {
  return fmt::format(
      "rendezvous at {} timed out after {} s: {} of {} ranks checked in; missing ranks: "
      "{}. Check that every rank was started with the same bootstrap.backend and "
      "STRATA_ROOT/SLURM step, and can reach {} (bootstrap.connect_timeout to wait longer)",
      root, seconds, count, size, rankList(missing), root);
}

namespace {

/// The ranks that check in at this server (Options::expected, or all but the server).
std::vector<int> expectedRanks(const Options& opt) {
  if (opt.expected) return *opt.expected;
  std::vector<int> all;
  for (int r = 0; r < opt.size; ++r) {
    if (r != opt.self) all.push_back(r);
  }
  return all;
}

}  // namespace

std::vector<net::Fd> collect(
    int listenFd, const Options& opt,
    const std::function<void(int rank, const std::vector<uint8_t>& record)>& onCheckIn) {
  const int n = opt.size;
  const int self = opt.self;
  const std::vector<int> expected = expectedRanks(opt);
  std::vector<char> isExpected(static_cast<size_t>(n), 0);
  for (int r : expected) {
    if (r < 0 || r >= n || r == self) {
      throw Error(ErrorCode::Internal,
                  fmt::format("rendezvous: rank {} cannot check in at rank {}'s rendezvous of {}",
                              r, self, n));
    }
    isExpected[static_cast<size_t>(r)] = 1;
  }
  const int total = static_cast<int>(expected.size()) + 1;
  const char* sub = opt.backend.c_str();
  Deadline deadline = Deadline::fromTimeout(opt.connectTimeout);
  struct Client {
    handshake::ListenSide hs;
    handshake::RecordReader reader;
  };
  std::list<Client> clients;
  std::vector<net::Fd> ready(static_cast<size_t>(n));
  std::vector<std::string> from(static_cast<size_t>(n));
  std::vector<net::Fd> duplicates;
  int count = 1;
  std::string failure;
  int failurePeer = -1;
  bool timedOut = false;
  std::string what = fmt::format("{} check-in record", opt.backend);
  auto logRejected = [&](const handshake::ListenSide& hs) {
    if (opt.quietRejects || hs.probe()) {
      STRATA_LOG(Debug, sub, "rendezvous: closed a connection from {}: {}", hs.remote().toString(),
                 hs.reason());
    } else {
      STRATA_LOG(Warn, sub, "rendezvous: rejected a connection from {}: {}", hs.remote().toString(),
                 hs.reason());
    }
  };

  auto accepted = [&](Client& c) {
    const int r = c.hs.peerRank();
    const auto& rec = c.reader.record();
    auto kind =
        wire::decodeHeader({rec.data(), wire::kRecordHeaderSize}, 0xffff, opt.maxRecord, what).kind;
    if (kind != opt.helloKind) {
      failurePeer = r;
      failure = fmt::format(
          "ranks disagree on bootstrap backend: rank {} has '{}', rank {} has '{}'. Every rank "
          "must use the same bootstrap.backend (check STRATA_* and strata.toml on every node)",
          self, opt.backend, r, backendOfKind(kind));
      ready[static_cast<size_t>(r)] = c.hs.takeFd();  // it gets the REJECT too
      return;
    }
    if (r != self && !isExpected[static_cast<size_t>(r)]) {
      failurePeer = r;
      failure = fmt::format(
          "rendezvous: rank {} checked in at rank {}'s rendezvous ({}), which serves other ranks: "
          "the ranks were given different rendezvous roots (ncclCommInitRankScalable: every rank "
          "must pass the same ids in the same order)",
          r, self, opt.root);
      duplicates.push_back(c.hs.takeFd());  // it gets the REJECT too
      return;
    }
    // The same rank again, on a new connection, after its first one was closed or reset: a
    // check-in retried because the network (or a relay) broke the first connection, not a
    // second process. Take the new connection in place of the dead one.
    const bool retried = r != self && ready[static_cast<size_t>(r)].valid() &&
                         net::peerHasClosed(ready[static_cast<size_t>(r)].get());
    if (retried) {
      STRATA_LOG(Debug, sub,
                 "rendezvous: rank {} checked in again from {}; its first connection (from {}) "
                 "was closed, so this is a retry",
                 r, c.hs.remote().toString(), from[static_cast<size_t>(r)]);
    } else if (r == self || ready[static_cast<size_t>(r)].valid()) {
      failurePeer = r;
      failure = fmt::format(
          "rendezvous: rank {} checked in twice (from {} and from {}); two "
          "processes were given the same rank",
          r, r == self ? fmt::format("rank {} itself", self) : from[static_cast<size_t>(r)],
          c.hs.remote().toString());
      duplicates.push_back(c.hs.takeFd());  // it gets the REJECT too
      return;
    }
    try {
      onCheckIn(r, rec);
    } catch (const Error& e) {
      failurePeer = r;
      failure = e.what();
    }
    from[static_cast<size_t>(r)] = c.hs.remote().toString();
    ready[static_cast<size_t>(r)] = c.hs.takeFd();
    if (failure.empty() && !retried) ++count;
  };

  for (;;) {
    if (count >= total && failure.empty()) {
      // Everyone is in; a check-in whose connection has closed since (cut by the network or a
      // relay) is retried by its rank, so wait for that instead of answering into the void.
      for (int r : expected) {
        auto& fd = ready[static_cast<size_t>(r)];
        if (fd.valid() && net::peerHasClosed(fd.get())) {
          STRATA_LOG(Debug, sub,
                     "rendezvous: rank {}'s check-in connection (from {}) closed before the "
                     "reply; waiting for its retry",
                     r, from[static_cast<size_t>(r)]);
          fd.reset();
          --count;
        }
      }
    }
    if (count >= total || !failure.empty()) break;
    if (deadline.expired()) {
      std::vector<int> missing;
      for (int r : expected) {
        if (!ready[static_cast<size_t>(r)].valid()) missing.push_back(r);
      }
      timedOut = true;
      failurePeer = missing.empty() ? -1 : missing.front();
      failure = timeoutMessage(opt.root, opt.connectTimeout, count, total, missing);
      break;
    }
    std::vector<pollfd> fds;
    fds.push_back({listenFd, POLLIN, 0});
    Deadline next = deadline;
    for (auto& c : clients) {
      fds.push_back({c.hs.fd(), POLLIN, 0});
      next = Deadline::earlier(next, c.hs.deadline());
    }
    int rc = ::poll(fds.data(), fds.size(), next.pollMs(1000) + 1);
    if (rc < 0 && errno != EINTR) {
      throw Error(ErrorCode::SystemError, fmt::format("poll(): {}", net::errnoText(errno)));
    }
    size_t i = 1;
    for (auto it = clients.begin(); it != clients.end() && failure.empty(); ++i) {
      Client& c = *it;
      bool readable = i < fds.size() && fds[i].revents != 0;
      bool drop = false;
      if (c.hs.state() == handshake::ListenSide::State::InProgress &&
          (readable || c.hs.deadline().expired())) {
        auto st = c.hs.step();
        if (st == handshake::ListenSide::State::Rejected) {
          logRejected(c.hs);
          drop = true;
        } else if (st == handshake::ListenSide::State::Accepted) {
          readable = true;  // the record may already be buffered
        }
      }
      if (!drop && c.hs.state() == handshake::ListenSide::State::Accepted && readable) {
        try {
          if (c.reader.step(c.hs.fd(), what)) {
            accepted(c);
            drop = true;
          }
        } catch (const Error& e) {
          STRATA_LOG(Warn, sub, "rendezvous: dropped rank {} connection from {}: {}",
                     c.hs.peerRank(), c.hs.remote().toString(), e.what());
          drop = true;
        }
      }
      // An authenticated rank that never sends its record: without this its expired deadline
      // would turn the poll above into a 1 ms loop until the rendezvous deadline.
      if (!drop && c.hs.state() == handshake::ListenSide::State::Accepted &&
          c.hs.deadline().expired()) {
        STRATA_LOG(Warn, sub,
                   "rendezvous: rank {} ({}) sent no check-in record within "
                   "bootstrap.handshake_timeout; closed",
                   c.hs.peerRank(), c.hs.remote().toString());
        drop = true;
      }
      it = drop ? clients.erase(it) : std::next(it);
    }
    if (rc > 0 && (fds[0].revents & POLLIN) && failure.empty()) {
      for (;;) {
        net::SockAddr remote;
        net::Fd fd = net::acceptOne(listenFd, &remote);
        if (!fd.valid()) break;
        clients.push_back(Client{
            handshake::ListenSide(std::move(fd), remote, opt.secret, handshake::Purpose::Rendezvous,
                                  self, n, Deadline::fromTimeout(opt.handshakeTimeout)),
            handshake::RecordReader(opt.maxRecord)});
        if (clients.back().hs.step() == handshake::ListenSide::State::Rejected) {
          logRejected(clients.back().hs);
          clients.pop_back();
        }
      }
    }
  }
  if (failure.empty()) return ready;
  for (auto& fd : duplicates) ready.push_back(std::move(fd));
  rejectAll(ready, opt, failure, timedOut);
  throw Error(timedOut ? ErrorCode::Timeout : ErrorCode::InvalidConfig, failure, failurePeer);
}

void rejectAll(std::vector<net::Fd>& ready, const Options& opt, const std::string& message,
               bool timedOut) {
  Deadline replyDeadline = Deadline::after(std::max(1.0, opt.handshakeTimeout));
  for (auto& fd : ready) {
    if (!fd.valid()) continue;
    try {
      handshake::writeRecord(fd.get(), encodeReject(opt.backend, message, timedOut), replyDeadline,
                             "rendezvous reject");
    } catch (const Error&) {
    }
  }
}

void serve(int listenFd, const Options& opt,
           const std::function<void(int rank, const std::vector<uint8_t>& record)>& onCheckIn,
           const std::function<std::vector<uint8_t>(int rank)>& reply) {
  std::vector<net::Fd> ready = collect(listenFd, opt, onCheckIn);
  answer(ready, opt, reply);
}

void answer(std::vector<net::Fd>& ready, const Options& opt,
            const std::function<std::vector<uint8_t>(int rank)>& reply) {
  std::string failure;
  int failurePeer = -1;
  Deadline replyDeadline = Deadline::after(std::max(1.0, opt.handshakeTimeout));
  for (int r : expectedRanks(opt)) {
    auto& fd = ready[static_cast<size_t>(r)];
    if (!fd.valid()) continue;
    try {
      handshake::writeRecord(fd.get(),
                             failure.empty() ? reply(r) : encodeReject(opt.backend, failure, false),
                             replyDeadline, fmt::format("rendezvous reply to rank {}", r));
    } catch (const Error& e) {
      if (failure.empty()) {
        failurePeer = r;
        failure = fmt::format("rendezvous: rank {} vanished before its reply: {}", r, e.what());
      }
    }
  }
  if (!failure.empty()) throw Error(ErrorCode::InvalidConfig, failure, failurePeer);
}

namespace {

std::string brokeNote(const std::string& broke, const std::string& server) {
  if (broke.empty()) return {};
  return fmt::format("; this rank's check-in connection broke before {} answered ({})", server,
                     broke);
}

}  // namespace

std::vector<uint8_t> checkIn(const std::vector<net::SockAddr>& rootAddrs, const Options& opt,
                             int rank, const std::vector<uint8_t>& hello) {
  Deadline deadline = Deadline::fromTimeout(opt.connectTimeout);
  const std::string server = fmt::format("rank {}", opt.self);
  std::string what =
      fmt::format("{} bootstrap rendezvous with {} at {}", opt.backend, server, opt.root);
  bool connectedOnce = false;
  // A check-in whose connection broke before rank 0 answered (the network, or a relay, reset
  // it): the retries that follow may find the rendezvous over; the final error says so.
  std::string brokeAfterCheckIn;
  for (;;) {
    net::Fd fd;
    try {
      fd = net::connectWithRetry(rootAddrs, deadline, what);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::Timeout) throw;
      // Nothing listens there (any more): rank 0 is gone or never started.
      throw Error(
          ErrorCode::Timeout,
          fmt::format("{} (bootstrap.connect_timeout={} s){}. Rank {} {}: check its "
                      "output for why",
                      e.what(), opt.connectTimeout, brokeNote(brokeAfterCheckIn, server), opt.self,
                      connectedOnce ? "took an earlier connection but no longer accepts: it "
                                      "exited or was killed, or this host cannot reach it "
                                      "any more"
                                    : "is not running (it exited, was killed or has not "
                                      "started), listens elsewhere, this host cannot "
                                      "reach it, or it has finished its rendezvous "
                                      "already (then the job runs without this process: "
                                      "was it given the rank of a live one?)"),
          opt.self);
    }
    connectedOnce = true;
    bool checkedIn = false;
    try {
      handshake::connectSide(fd.get(), opt.secret, handshake::Purpose::Rendezvous, rank, opt.size,
                             opt.self, deadline, what);
      handshake::writeRecord(fd.get(), hello, deadline, what);
      // Checked in: rank 0 answers when every rank has, or when its own connect_timeout passes
      // (counted from before it accepted us), with a verdict naming the missing ranks. Wait a
      // little longer than that, so that this rank reports that verdict rather than a timeout
      // of its own (a rank started before rank 0 began serving timed out first).
      checkedIn = true;
      const Deadline replyDeadline = Deadline::fromTimeout(
          opt.connectTimeout > 0 ? opt.connectTimeout + std::max(1.0, opt.handshakeTimeout) : 0);
      auto rec = handshake::readRecord(fd.get(), std::max(opt.maxRecord, kMaxMessage + 512),
                                       replyDeadline, what);
      checkedIn = false;  // answered: a REJECT's own error stands as it is
      auto h = wire::decodeHeader({rec.data(), wire::kRecordHeaderSize}, 0xffff,
                                  std::max(opt.maxRecord, kMaxMessage + 512), what);
      if (h.kind == kRejectKind) throwReject(rec, opt.self);
      return rec;
    } catch (const Error& e) {
      // Rank 0 of an earlier bootstrap in this process may still be closing, or the port
      // belongs to something else for a moment: retry until the deadline.
      bool transient = e.code() == ErrorCode::PeerLost && !deadline.expired();
      if (!transient && checkedIn && e.code() == ErrorCode::Timeout) {
        throw Error(ErrorCode::Timeout,
                    fmt::format("{}: {} took this rank's check-in but sent no answer within "
                                "bootstrap.connect_timeout={} s and then some: {} is stuck "
                                "(stopped, or starved of CPU)",
                                e.what(), server, opt.connectTimeout, server),
                    opt.self);
      }
      if (!transient) {
        if (e.code() == ErrorCode::Timeout &&
            std::string(e.what()).find(server + " (") == std::string::npos) {
          // e.what() starts with `what` already. The port took the connection, so something
          // holds it; a rank 0 that finished its rendezvous never answers again (strata-run's
          // root socket stays open for the life of rank 0).
          if (!brokeAfterCheckIn.empty()) {
            throw Error(ErrorCode::Timeout,
                        fmt::format("{}{}, and {} did not complete a new check-in within "
                                    "bootstrap.connect_timeout={} s: the network between this "
                                    "host and {}'s failed, or {} gave up on this rank "
                                    "(check its output)",
                                    e.what(), brokeNote(brokeAfterCheckIn, server), server,
                                    opt.connectTimeout, server, server),
                        opt.self);
          }
          throw Error(ErrorCode::Timeout,
                      fmt::format("{}: {} accepted the connection but did not complete the "
                                  "check-in within bootstrap.connect_timeout={} s. Either {} "
                                  "is stuck, the network to it broke, or its rendezvous is over "
                                  "because the job is already running: was this process given "
                                  "the rank of a live one (a second launch of the same rank, or "
                                  "a leftover STRATA_* environment)?",
                                  e.what(), server, opt.connectTimeout, server),
                      opt.self);
        }
        throw;
      }
      if (checkedIn && brokeAfterCheckIn.empty()) brokeAfterCheckIn = e.what();
      STRATA_LOG(Debug, opt.backend.c_str(), "rendezvous attempt failed, retrying: {}", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

}  // namespace strata::rendezvous
