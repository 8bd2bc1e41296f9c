// send and recv through the worker; a recv from any source is refused at the call.

#include <sstream>

#include <c10/util/Exception.h>

#include <strata/error.hpp>

#include "internal.hpp"
#include "process_group.hpp"

namespace strata::torchbind {
namespace {

// The header strata puts in front of every torch send: torch matches a recv by tag, strata
// delivers in order, so the receiver checks that what arrives is what it waits for.
struct P2pHeader {
  int64_t magic = 0x73747261746170LL;  // "stratap"
  int64_t tag = 0;
  int64_t count = 0;
  int64_t type = 0;
};

// `role` is "destination" or "source": a rank talks point to point with another rank only.
void checkPeer(int peer, int rank, int size, const char* what, const char* role) {
  TORCH_CHECK(peer >= 0 && peer < size && peer != rank, "strata: ", what, ": ", role, " ", peer,
              " is not another rank of 0..", size - 1);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::send(std::vector<at::Tensor>& tensors, int dst,
                                                        int tag) {
  at::Tensor t = single(tensors, "send");
  const DataType type = typeOf(t, "send");
  checkPeer(dst, rank_, size_, "send", "destination");
  // The data is taken now: the caller may reuse the tensor once the work completes, and a
  // host send completes when strata holds the data.
  return enqueue(
      c10d::OpType::SEND, {t},
      [this, t, type, dst, tag]() {
        at::Tensor src = t.contiguous();
        P2pHeader h;
        h.tag = tag;
        h.count = src.numel();
        h.type = static_cast<int64_t>(type);
        comm_->send(&h, sizeof h, DataType::Uint8, dst);
        comm_->send(dataOf(src), countOf(src), type, dst);
      },
      Kind::Send);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::recv(std::vector<at::Tensor>& tensors, int src,
                                                        int tag) {
  at::Tensor t = single(tensors, "recv");
  const DataType type = typeOf(t, "recv");
  checkPeer(src, rank_, size_, "recv", "source");
  return enqueue(
      c10d::OpType::RECV, {t},
      [this, t, type, src, tag]() mutable {
        P2pHeader h;
        comm_->recv(&h, sizeof h, DataType::Uint8, src);
        if (h.magic != P2pHeader{}.magic || h.tag != tag || h.count != t.numel() ||
            h.type != static_cast<int64_t>(type)) {
          std::ostringstream s;
          s << "recv from rank " << src << " with tag " << tag << " expects " << t.numel()
            << " elements of " << toString(type) << ", but the next message from rank " << src;
          if (h.magic != P2pHeader{}.magic) {
            s << " is not a torch send (the ranks issued different calls)";
          } else {
            s << " has tag " << h.tag << " and " << h.count << " elements of "
              << toString(static_cast<DataType>(h.type));
          }
          s << ". strata matches the sends and receives between two ranks in the order they "
               "are issued, tags included; the process group is unusable now";
          throw Error(ErrorCode::ProtocolError, s.str(), src);
        }
        withContiguous(t, true,
                       [&](at::Tensor& c) { comm_->recv(dataOf(c), countOf(c), type, src); });
      },
      Kind::Recv);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupStrata::recvAnysource(std::vector<at::Tensor>&, int) {
  TORCH_CHECK(false,
              "strata: recv from any source (dist.recv or dist.irecv without src) is not "
              "supported: strata matches messages per peer; pass src=");
}

}  // namespace strata::torchbind
