// Opening and closing this rank's libfabric objects (fabric, domain, CQ, AV, endpoint, the
// internal region) on the provider fabric_provider.cpp chose, and memory registration.

#include "fabric_endpoint.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "base/config_keys.hpp"
#include "base/log.hpp"
#include "fabric_provider.hpp"
#include "fabric_shm_regions.hpp"

namespace strata::fabric {
namespace {

constexpr const char* kLog = "fabric";
// Largest single fi_write we post even when the provider allows more (tcp;ofi_rxm reports
// SIZE_MAX): bounded ops keep EAGAIN retries and completions flowing on very large writes.
constexpr size_t kMaxChunk = size_t{64} << 20;
// First guess of the endpoint address length (fi_getname says when it needs more).
constexpr size_t kAddressGuess = 64;
// Alignment of the internal region (a cache line; aligned_alloc needs a multiple of it).
constexpr size_t kInternalAlign = 64;
// Where libfabric's shm provider creates its regions (shm_open).
constexpr const char* kShmDir = "/dev/shm";

// The index of this process's next shm endpoint, for its region's name.
std::atomic<uint64_t> nextShmEndpoint{0};

}  // namespace

std::string fiError(ssize_t rc) {
  return fmt::format("{} ({})", fi_strerror(static_cast<int>(rc < 0 ? -rc : rc)), rc);
}

Endpoint::Endpoint(const backend::TransportInit& init, std::string provider, bool wantHmem)
    : provider_(std::move(provider)), rank_(init.rank) {
  if (init.config) {
    timeout_ = config::getDouble(*init.config, "transport.timeout");
    probeTimeout_ = config::getDouble(*init.config, "transport.fabric.probe_timeout");
  }
  nic_.names = init.nicNames;
  nic_.busId = init.nicBusId;
  nic_.why = init.nicWhy;
  nic_.required = init.nicRequired;
  try {
    open(wantHmem);
  } catch (...) {
    close();
    throw;
  }
}

Endpoint::~Endpoint() {
  close();
  if (provider_ == "shm") sweepStaleShmRegions(kShmDir, pidNamespace_);
}

std::string Endpoint::describe() const {
  return fmt::format("fabric transport (rank {}, provider {})", rank_, provider_);
}

void Endpoint::open(bool wantHmem) {
  ProviderChoice choice = chooseProvider(provider_, wantHmem, rank_, describe(), timeout_, nic_);
  info_ = choice.info.release();
  deliveryComplete_ = choice.deliveryComplete;
  orderedWaw_ = choice.waw;
  provider_ = info_->fabric_attr->prov_name ? info_->fabric_attr->prov_name : provider_;
  if (provider_ == "shm") {
    pidNamespace_ = pidNamespace();
    sweepStaleShmRegions(kShmDir, pidNamespace_);
  }
  hmem_ = (info_->caps & FI_HMEM) != 0;
  mrMode_ = info_->domain_attr->mr_mode;
  if (mrMode_ & FI_MR_RAW) {
    throw Error(ErrorCode::NotSupported,
                fmt::format("{}: the provider needs FI_MR_RAW (memory keys wider than 64 bits), "
                            "which strata's fabric transport does not implement; choose another "
                            "provider in transport.fabric.provider",
                            describe()));
  }
  if (mrMode_ & ~(kMrModeHandled | FI_MR_HMEM)) {
    STRATA_LOG(Warn, kLog, "{}: unhandled mr_mode bits {:#x}", describe(),
               mrMode_ & ~(kMrModeHandled | FI_MR_HMEM));
  }
  size_t maxMsg = info_->ep_attr->max_msg_size;
  maxChunk_ = std::max<size_t>(1, std::min(maxMsg, kMaxChunk));

  auto check = [&](int rc, const char* what) {
    if (rc != 0) {
      throw Error(ErrorCode::BackendError,
                  fmt::format("{}: {} failed: {}", describe(), what, fiError(rc)));
    }
  };
  check(fi_fabric(info_->fabric_attr, &fabric_, nullptr), "fi_fabric");
  check(fi_domain(fabric_, info_, &domain_, nullptr), "fi_domain");

  fi_cq_attr cqAttr{};
  cqAttr.format = FI_CQ_FORMAT_CONTEXT;
  cqAttr.wait_obj = FI_WAIT_FD;
  if (fi_cq_open(domain_, &cqAttr, &cq_, nullptr) != 0) {
    // No wait fd from this provider: the progress thread then sleeps with back-off.
    cq_ = nullptr;
    cqAttr.wait_obj = FI_WAIT_NONE;
    check(fi_cq_open(domain_, &cqAttr, &cq_, nullptr), "fi_cq_open");
  } else if (fi_control(&cq_->fid, FI_GETWAIT, &waitFd_) != 0) {
    waitFd_ = -1;
  }

  fi_av_attr avAttr{};
  avAttr.type = info_->domain_attr->av_type;
  check(fi_av_open(domain_, &avAttr, &av_, nullptr), "fi_av_open");
  check(fi_endpoint(domain_, info_, &ep_, nullptr), "fi_endpoint");
  if (provider_ == "shm" && pidNamespace_ != 0) {
    // Name the endpoint (and so its file in /dev/shm) with our PID namespace, so that the sweep
    // of another process can tell whether the pid in it is one it can judge. Must precede
    // fi_enable, which creates the region.
    std::string name = shmRegionName(pidNamespace_, ::getpid(), nextShmEndpoint.fetch_add(1));
    int rc = fi_setname(&ep_->fid, name.data(), name.size() + 1);
    if (rc != 0) {
      STRATA_LOG(Warn, kLog,
                 "{}: naming the shm endpoint {} failed ({}); it keeps libfabric's name, which "
                 "the stale-file sweep leaves alone",
                 describe(), name, fiError(rc));
    }
  }
  check(fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
  check(fi_ep_bind(ep_, &av_->fid, 0), "fi_ep_bind(av)");
  check(fi_enable(ep_), "fi_enable");

  size_t len = kAddressGuess;
  address_.resize(len);
  int rc = fi_getname(&ep_->fid, address_.data(), &len);
  if (rc == -FI_ETOOSMALL) {
    address_.resize(len);
    rc = fi_getname(&ep_->fid, address_.data(), &len);
  }
  check(rc, "fi_getname");
  address_.resize(len);

  // aligned_alloc needs a size that is a multiple of the alignment.
  size_t bytes = ((kFirstSlotWord + kSlots) * sizeof(uint64_t) + kInternalAlign - 1) /
                 kInternalAlign * kInternalAlign;
  internal_ = static_cast<uint64_t*>(std::aligned_alloc(kInternalAlign, bytes));
  if (!internal_) throw Error(ErrorCode::SystemError, describe() + ": out of memory");
  std::memset(internal_, 0, bytes);
  internalMr_ = registerRegion(internal_, bytes, FI_REMOTE_WRITE | FI_WRITE, false, 0);
  freeSlots_.reserve(kSlots);
  for (int i = kSlots - 1; i >= 0; --i) freeSlots_.push_back(i);

  STRATA_LOG(Debug, kLog,
             "{}: fabric {} domain {} mr_mode {:#x} delivery_complete {} ordered_waw {} "
             "hmem {} max chunk {} wait fd {} data progress {}",
             describe(), info_->fabric_attr->name ? info_->fabric_attr->name : "?",
             info_->domain_attr->name ? info_->domain_attr->name : "?", mrMode_, deliveryComplete_,
             orderedWaw_, hmem_, maxChunk_, waitFd_,
             static_cast<int>(info_->domain_attr->data_progress));
}

void Endpoint::close() noexcept {
  // Operations still posted when the endpoint closes never complete; their contexts are ours.
  for (OpContext* op : live_) delete op;
  live_.clear();
  if (internalMr_) fi_close(&internalMr_->fid);
  internalMr_ = nullptr;
  if (ep_) fi_close(&ep_->fid);
  if (av_) fi_close(&av_->fid);
  if (cq_) fi_close(&cq_->fid);
  if (domain_) fi_close(&domain_->fid);
  if (fabric_) fi_close(&fabric_->fid);
  ep_ = nullptr;
  av_ = nullptr;
  cq_ = nullptr;
  domain_ = nullptr;
  fabric_ = nullptr;
  if (info_) fi_freeinfo(info_);
  info_ = nullptr;
  std::free(internal_);
  internal_ = nullptr;
}

fid_mr* Endpoint::registerRegion(void* data, size_t bytes, uint64_t access, bool cuda,
                                 int cudaDevice) {
  iovec iov{data, bytes};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = access;
  // Without FI_MR_PROV_KEY the application picks keys, unique within the domain.
  attr.requested_key = (mrMode_ & FI_MR_PROV_KEY) ? 0 : nextKey_.fetch_add(1);
  if (cuda) {
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = cudaDevice;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  fid_mr* mr = nullptr;
  int rc = fi_mr_regattr(domain_, &attr, 0, &mr);
  if (rc != 0) {
    throw Error(ErrorCode::BackendError,
                fmt::format("{}: fi_mr_regattr of {} bytes at {} ({} memory) failed: {}",
                            describe(), bytes, data, cuda ? "cuda" : "host", fiError(rc)));
  }
  if (mrMode_ & FI_MR_ENDPOINT) {
    rc = fi_mr_bind(mr, &ep_->fid, 0);
    if (rc == 0) rc = fi_mr_enable(mr);
    if (rc != 0) {
      fi_close(&mr->fid);
      throw Error(ErrorCode::BackendError,
                  fmt::format("{}: binding a memory region to the endpoint (FI_MR_ENDPOINT) "
                              "failed: {}",
                              describe(), fiError(rc)));
    }
  }
  return mr;
}

void Endpoint::closeRegion(fid_mr* mr) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  int rc = fi_close(&mr->fid);
  if (rc != 0) STRATA_LOG(Warn, kLog, "{}: closing a memory region: {}", describe(), fiError(rc));
}

uint64_t* Endpoint::slotWord(int slot) noexcept {
  return internal_ + kFirstSlotWord + slot;
}
uint64_t* Endpoint::probeSource() noexcept {
  return internal_ + kProbeSourceWord;
}
void* Endpoint::internalDesc() noexcept {
  return fi_mr_desc(internalMr_);
}

}  // namespace strata::fabric
