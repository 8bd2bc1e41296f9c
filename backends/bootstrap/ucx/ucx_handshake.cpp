// The strata connection handshake (net/handshake_codec.hpp) carried in UCX tag messages
// during the rendezvous: rank 0 gives every connection a random 24-bit id (UCX client-server
// endpoints carry no rank) and sends the CHALLENGE; the client answers AUTH and rank 0 the
// RESULT, each with tag {Handshake, connection id, step}. Only an authenticated connection may
// check in (ucx_rendezvous.cpp).

#include <algorithm>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/crypto.hpp"
#include "base/log.hpp"
#include "base/wire.hpp"
#include "ucx_internal.hpp"

namespace strata::ucx {

void UcxBootstrap::onRvError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* c = static_cast<RvConn*>(arg);
  if (c->failed.load()) return;
  c->why = statusText(status);
  c->failed.store(true);
}

void UcxBootstrap::rvSend(Lock& /*lk*/, RvConn& c, uint32_t step, std::vector<uint8_t> record) {
  ucs_status_t st = postSend(c.ep, -1, makeTag(Kind::Handshake, static_cast<int>(c.id), step),
                             record.data(), record.size());
  if (st != UCS_OK && !c.failed.load()) {
    c.why = statusText(st);
    c.failed.store(true);
  }
}

// Takes one waiting message matching tag/mask, if any. Larger than kMaxRecord: received and
// returned empty (the caller treats it as garbage).
bool UcxBootstrap::rvTryRecv(Lock& lk, uint64_t tag, uint64_t mask, std::vector<uint8_t>& out,
                             uint64_t* senderTag) {
  ucp_tag_recv_info_t info{};
  ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, tag, mask, 1, &info);
  if (!msg) return false;
  // A stranger's oversized message is truncated (and then treated as garbage).
  const size_t capacity = std::min(info.length, kMaxRecord);
  std::vector<uint8_t> buf(std::max<size_t>(capacity, 1));
  auto state = std::make_unique<OpState>();
  void* req = recvProbed(msg, buf.data(), capacity, *state);
  if (UCS_PTR_IS_ERR(req)) {
    out.clear();
  } else {
    waitRequest(lk, req, state, Deadline::after(std::max(handshakeTimeout_, 1.0)), -1, "rendezvous",
                Kind::Handshake, 0);
    buf.resize(info.length);
    out = info.length <= kMaxRecord && state->status == UCS_OK ? std::move(buf)
                                                               : std::vector<uint8_t>{};
  }
  if (senderTag) *senderTag = info.sender_tag;
  return true;
}

bool UcxBootstrap::rvWait(Lock& lk, RvConn& c, uint64_t tag, uint64_t mask,
                          const Deadline& deadline, std::vector<uint8_t>& out,
                          uint64_t* senderTag) {
  for (;;) {
    progress(lk);
    if (rvTryRecv(lk, tag, mask, out, senderTag)) return true;
    if (c.failed.load() || deadline.expired()) return false;
    blockOnce(lk, deadline, 20);
  }
}

RvConn* UcxBootstrap::rvAccept(Lock& lk, ucp_conn_request_h request) {
  auto c = std::make_unique<RvConn>();
  ucp_conn_request_attr_t qa{};
  qa.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  if (ucp_conn_request_query(request, &qa) == UCS_OK) {
    c->remote = net::SockAddr::fromRaw(reinterpret_cast<const sockaddr*>(&qa.client_address),
                                       sizeof(qa.client_address))
                    .toString();
  }
  do {
    uint8_t b[3];
    crypto::randomBytes(b);
    c->id = (uint32_t{b[0]} << 16 | uint32_t{b[1]} << 8 | b[2]);
  } while (c->id == 0 || std::any_of(rvConns_.begin(), rvConns_.end(),
                                     [&](const auto& o) { return o->id == c->id; }));
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.conn_request = request;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxBootstrap::onRvError;
  ep.err_handler.arg = c.get();
  ucs_status_t st = ucp_ep_create(worker_, &ep, &c->ep);
  if (st != UCS_OK) {
    c->ep = nullptr;
    STRATA_LOG(Warn, kSub, "rendezvous: accepting a connection from {} failed: {}", c->remote,
               statusText(st));
    return nullptr;
  }
  c->challenge = handshake::makeChallenge(handshake::Purpose::Rendezvous, 0);
  c->deadline = Deadline::fromTimeout(handshakeTimeout_);
  rvSend(lk, *c, kStepChallenge, handshake::encode(c->challenge));
  rvConns_.push_back(std::move(c));
  return rvConns_.back().get();
}

std::string UcxBootstrap::rvServeAuth(Lock& lk, RvConn& c) {
  std::vector<uint8_t> rec;
  if (!rvTryRecv(lk, makeTag(Kind::Handshake, static_cast<int>(c.id), kStepAuth), kFullMask, rec)) {
    if (c.failed.load()) return fmt::format("its endpoint failed during the handshake: {}", c.why);
    if (c.deadline.expired()) return "sent no complete handshake in time";
    return {};
  }
  std::string why;
  handshake::Auth auth;
  try {
    auth = handshake::decodeAuth(rec, "handshake");
    why = handshake::checkAuth(auth, launch_.secret, c.challenge, launch_.size);
  } catch (const Error& e) {
    why = fmt::format("garbage instead of a handshake ({})", e.what());
  }
  handshake::Result result;
  if (why.empty()) {
    result = handshake::acceptResult(launch_.secret, c.challenge, auth);
    c.rank = auth.rank;
    c.state = RvConn::State::WaitHello;
    c.deadline = Deadline::fromTimeout(handshakeTimeout_);
  } else {
    result.reason = why;
  }
  rvSend(lk, c, kStepResult, handshake::encode(result));
  return why;
}

bool UcxBootstrap::rvAuthenticate(Lock& lk, RvConn& c, const Deadline& deadline,
                                  const std::string& what) {
  std::vector<uint8_t> rec;
  uint64_t senderTag = 0;
  if (!rvWait(lk, c, makeTag(Kind::Handshake, 0, kStepChallenge), kStepMask, deadline, rec,
              &senderTag)) {
    return false;
  }
  c.id = static_cast<uint32_t>(tagRank(senderTag));
  auto challenge = handshake::decodeChallenge(rec, what);
  handshake::checkChallenge(challenge, handshake::Purpose::Rendezvous, 0, what);
  auto auth = handshake::makeAuth(launch_.secret, challenge, launch_.rank, launch_.size);
  rvSend(lk, c, kStepAuth, handshake::encode(auth));
  if (!rvWait(lk, c, makeTag(Kind::Handshake, static_cast<int>(c.id), kStepResult), kFullMask,
              deadline, rec)) {
    return false;
  }
  handshake::checkResult(handshake::decodeResult(rec, what), launch_.secret, challenge, auth, what);
  return true;
}

}  // namespace strata::ucx
