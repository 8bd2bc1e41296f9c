// Creating the process group (the rendezvous through torch's Store) and ending it.

#include "process_group.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <utility>

#include <c10/util/Exception.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <strata/bootstrap.hpp>
#include <strata/config.hpp>
#include <strata/error.hpp>

#include "internal.hpp"

namespace strata::torchbind {
namespace {

std::string freshSecret() {
  std::random_device rd;
  std::ostringstream s;
  for (int i = 0; i < 8; ++i) {
    char buf[9];
    std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(rd()));
    s << buf;
  }
  return s.str();
}

}  // namespace

ProcessGroupStrata::ProcessGroupStrata(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                       int size, std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), store_(store), timeout_(timeout) {
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "strata: rank ", rank, " of ", size,
              " is not a valid process group member");
  TORCH_CHECK(timeout.count() > 0, "strata: the timeout must be positive");
  Config config = Config::load();
  const std::string secs = seconds(timeout);
  config.set("bootstrap.timeout", secs)
      .set("bootstrap.connect_timeout", secs)
      .set("transport.timeout", secs);

  // Who is on this host: every rank's host name, through the store (N reads per rank).
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "unknown");
  store_->set("strata/host/" + std::to_string(rank), bytesOf(host));
  int localRank = 0, localSize = 0;
  for (int r = 0; r < size; ++r) {
    if (stringOf(store_->get("strata/host/" + std::to_string(r))) == host) {
      if (r < rank) ++localRank;
      ++localSize;
    }
  }

  ExplicitLaunch launch{rank, size, localRank, localSize, "", "", {}};
  std::shared_ptr<Bootstrap> bootstrap;
  try {
    if (size == 1) {
      bootstrap = createTcpBootstrap(launch, config);
    } else if (rank == 0) {
      // env:// names rank 0's host in MASTER_ADDR: listen on the interface that reaches it.
      const char* masterAddr = std::getenv("MASTER_ADDR");
      RendezvousListener listener(config, masterAddr ? masterAddr : "");
      launch.root = listener.address();
      launch.secret = freshSecret();
      store_->set("strata/secret", bytesOf(launch.secret));
      store_->set("strata/root", bytesOf(launch.root));
      bootstrap = createTcpBootstrap(launch, config, &listener);
    } else {
      launch.secret = stringOf(store_->get("strata/secret"));
      launch.root = stringOf(store_->get("strata/root"));
      bootstrap = createTcpBootstrap(launch, config);
    }
    root_ = launch.root;
    comm_ = Communicator::create(std::move(bootstrap), config);
  } catch (const Error& e) {
    throw std::runtime_error(std::string("strata: creating the process group failed on rank ") +
                             std::to_string(rank) + ": " + e.what());
  }
  worker_ = std::thread([this] { workerLoop(); });
}

ProcessGroupStrata::ProcessGroupStrata(const c10::intrusive_ptr<c10d::Store>& store,
                                       std::unique_ptr<Communicator> comm,
                                       std::chrono::milliseconds timeout, std::string root)
    : c10d::ProcessGroup(comm->rank(), comm->size()),
      store_(store),
      timeout_(timeout),
      root_(std::move(root)),
      comm_(std::move(comm)) {
  worker_ = std::thread([this] { workerLoop(); });
}

c10::intrusive_ptr<ProcessGroupStrata> ProcessGroupStrata::shrink(const std::vector<int>& exclude) {
  // On the caller's thread: the revoke inside makes a call the worker is in fail at once.
  std::unique_ptr<Communicator> next;
  try {
    next = exclude.empty() ? comm_->shrink() : comm_->shrink(exclude);
  } catch (const Error& e) {
    throw std::runtime_error(std::string("strata: shrink_group failed on rank ") +
                             std::to_string(rank_) + ": " + e.what());
  }
  // The parent's store under a prefix of its own (monitored_barrier's keys); none when the
  // parent had none (a group from grow or join_group).
  c10::intrusive_ptr<c10d::Store> store;
  if (store_) {
    store = c10::make_intrusive<c10d::PrefixStore>(
        "strata-shrink-" + std::to_string(shrinks_++) + "/", store_);
  }
  return c10::make_intrusive<ProcessGroupStrata>(store, std::move(next), timeout_, root_);
}

std::string ProcessGroupStrata::growInvitation(int newSize) {
  try {
    return comm_->growInvitation(newSize);
  } catch (const Error& e) {
    throw std::runtime_error(std::string("strata: grow_invitation: ") + e.what());
  }
}

c10::intrusive_ptr<ProcessGroupStrata> ProcessGroupStrata::grow(int newSize) {
  std::unique_ptr<Communicator> next;
  try {
    next = comm_->grow(newSize);
  } catch (const Error& e) {
    throw std::runtime_error(std::string("strata: grow failed on rank ") + std::to_string(rank_) +
                             ": " + e.what());
  }
  return c10::make_intrusive<ProcessGroupStrata>(c10::intrusive_ptr<c10d::Store>(), std::move(next),
                                                 timeout_, root_);
}

c10::intrusive_ptr<ProcessGroupStrata> ProcessGroupStrata::join(const std::string& invitation,
                                                                int index,
                                                                std::chrono::milliseconds timeout) {
  Config config = Config::load();
  const std::string secs = seconds(timeout);
  config.set("bootstrap.timeout", secs)
      .set("bootstrap.connect_timeout", secs)
      .set("transport.timeout", secs);
  std::unique_ptr<Communicator> comm;
  try {
    comm = Communicator::join(invitation, index, config);
  } catch (const Error& e) {
    throw std::runtime_error(std::string("strata: join_group failed: ") + e.what());
  }
  return c10::make_intrusive<ProcessGroupStrata>(c10::intrusive_ptr<c10d::Store>(), std::move(comm),
                                                 timeout, "");
}

void ProcessGroupStrata::revoke(const std::string& reason) {
  comm_->revoke(reason);
}

std::vector<int> ProcessGroupStrata::lostRanks() const {
  return comm_->lostRanks();
}

ProcessGroupStrata::~ProcessGroupStrata() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (!worker_.joinable()) return;
  // Python may drop the last reference with the GIL held (a DDP Reducer at exit), while the worker
  // frees the tensors of its last item, which needs the GIL: join without it.
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release release;
    worker_.join();
  } else {
    worker_.join();
  }
}

std::string ProcessGroupStrata::describe() const {
  std::ostringstream s;
  s << "strata rank " << rank_ << " of " << size_ << ", root " << (root_.empty() ? "-" : root_)
    << ", timeout " << seconds(timeout_) << " s";
  return s.str();
}

}  // namespace strata::torchbind
