// Reading and writing frames on one connection of the mesh (docs/wire-format.md, "Peer
// frames"). The driver calls readConn and writeConn when the socket is ready; a complete DATA
// frame goes to its (peer, tag) inbox, the control frames to failures.cpp.

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "mesh_impl.hpp"

namespace strata::mesh {
namespace {

constexpr size_t kReadBudget = 4u << 20;  // per connection per poll round, for fairness

}  // namespace

void PeerMesh::Impl::queueFrame(Conn& c, FrameType type, int32_t tag, const uint8_t* data,
                                size_t len) {
  OutFrame f;
  f.bytes.resize(kFrameHeaderSize + len);
  encodeFrameHeader(f.bytes.data(), type, tag, len);
  if (len) std::memcpy(f.bytes.data() + kFrameHeaderSize, data, len);
  f.seq = ++c.queuedSeq;
  c.outq.push_back(std::move(f));
}

bool PeerMesh::Impl::startFrame(Conn& c) {
  FrameHeader h = decodeFrameHeader(c.header);
  c.headerGot = 0;
  if (std::string why = checkFrameHeader(h, opt.maxMessage); !why.empty()) {
    protocolViolation(c, why);
    return false;
  }
  const uint64_t len = h.length;
  c.type = static_cast<FrameType>(h.type);
  c.tag = h.tag;
  c.payload.size = len;
  c.payload.data.reset(len ? new uint8_t[len] : nullptr);
  c.payloadGot = 0;
  c.inPayload = true;
  return true;
}

void PeerMesh::Impl::finishFrameIfComplete(Conn& c) {
  if (c.inPayload && c.payloadGot == c.payload.size) {
    c.inPayload = false;
    dispatch(c);
    c.payload = Message{};
  }
}

void PeerMesh::Impl::dispatch(Conn& c) {
  switch (c.type) {
    case FrameType::Data:
      peers[c.peer]->inbox[c.tag].push_back(std::move(c.payload));
      cv.notify_all();
      break;
    case FrameType::Goodbye:
      onGoodbye(c);
      break;
    case FrameType::Abort:
      onAbort(c);
      break;
    case FrameType::Lost:
      onLost(c);
      break;
  }
}

// Small frames arrive through one staging buffer (one recv() for many frames); the bulk of a
// large payload is read straight into its final buffer.
void PeerMesh::Impl::readConn(Conn& c) {
  size_t budget = kReadBudget;
  while (c.fd.valid() && budget > 0) {
    bool direct = c.inPayload && c.payload.size - c.payloadGot >= kStageSize;
    size_t want = direct ? std::min(c.payload.size - c.payloadGot, budget) : kStageSize;
    uint8_t* dst = direct ? c.payload.data.get() + c.payloadGot : stage.data();
    ssize_t n = ::recv(c.fd.get(), dst, want, MSG_DONTWAIT);
    if (n == 0) {
      closeConn(c, fmt::format("the connection with rank {} closed without a goodbye (the "
                               "process died or was killed)",
                               c.peer));
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      closeConn(c, fmt::format("the connection with rank {} failed: {} (the process died or "
                               "its host is unreachable)",
                               c.peer, net::errnoText(errno)));
      return;
    }
    size_t got = static_cast<size_t>(n);
    budget -= std::min(budget, got);
    if (direct) {
      c.payloadGot += got;
      finishFrameIfComplete(c);
    } else {
      const uint8_t* p = stage.data();
      while (got > 0 && c.fd.valid()) {
        size_t k;
        if (!c.inPayload) {
          k = std::min(got, kFrameHeaderSize - c.headerGot);
          std::memcpy(c.header + c.headerGot, p, k);
          c.headerGot += k;
          if (c.headerGot == kFrameHeaderSize && !startFrame(c)) return;
        } else {
          k = std::min(got, c.payload.size - c.payloadGot);
          std::memcpy(c.payload.data.get() + c.payloadGot, p, k);
          c.payloadGot += k;
        }
        p += k;
        got -= k;
        finishFrameIfComplete(c);
      }
    }
    // A short read means the socket is drained for now; poll() reports the rest.
    if (static_cast<size_t>(n) < want) return;
  }
}

void PeerMesh::Impl::writeConn(Conn& c) {
  while (c.fd.valid() && !c.outq.empty()) {
    OutFrame& f = c.outq.front();
    ssize_t n = ::send(c.fd.get(), f.bytes.data() + f.offset, f.bytes.size() - f.offset,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      closeConn(c, fmt::format("writing to rank {} failed: {}", c.peer, net::errnoText(errno)));
      return;
    }
    f.offset += static_cast<size_t>(n);
    if (f.offset == f.bytes.size()) {
      c.doneSeq = f.seq;
      c.outq.pop_front();
      cv.notify_all();
    }
  }
}

}  // namespace strata::mesh
