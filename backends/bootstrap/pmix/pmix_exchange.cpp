// What the ranks tell each other through PMIx when a bootstrap is created: their mesh listener
// addresses and rank 0's job secret, in one collecting fence (docs/backends.md, "Creation"; why
// PMIx may carry the secret is under "Trust" there).

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <strata/error.hpp>

#include "base/crypto.hpp"
#include "base/wire.hpp"
#include "net/socket.hpp"
#include "pmix_internal.hpp"

namespace strata::pmix {

MeshDirectory exchangeAddresses(uint64_t instance, int rank, int size,
                                const std::vector<int>& others, const std::string& address,
                                double timeout) {
  // Rank 0 makes up the job secret and publishes it with its address, in the same fence.
  std::string secret = rank == 0 ? crypto::randomSecretHex() : std::string();
  wire::Writer body;
  body.str(address).str(secret);
  Value mine{Op::Create, instance, 0, rank, body.take()};
  auto rec = encodeValue(mine);
  auto values = dataFence(&rec, kCreatePayloadMax, others, timeout, "create (address exchange)");

  std::vector<std::string> table(static_cast<size_t>(size));
  table[static_cast<size_t>(rank)] = address;
  for (size_t i = 0; i < others.size(); ++i) {
    int peer = others[i];
    auto payload = decodeValue(values[i], mine, peer);
    wire::Reader r(payload, fmt::format("pmix create record of rank {}", peer));
    std::string addr = r.str(kMaxAddress, "address");
    std::string peerSecret = r.str(kMaxSecret, "secret");
    r.expectEnd();
    try {
      net::SockAddr::parseNumeric(addr);
    } catch (const Error&) {
      throw Error(
          ErrorCode::ProtocolError,
          fmt::format("pmix bootstrap: rank {} published a bad mesh address '{}'", peer, addr),
          peer);
    }
    table[static_cast<size_t>(peer)] = addr;
    if (peer == 0) secret = peerSecret;
  }
  if (secret.size() < 32) {
    throw Error(ErrorCode::ProtocolError,
                fmt::format("pmix bootstrap: rank 0 published a job secret of {} characters "
                            "(expected 64)",
                            secret.size()),
                0);
  }
  return {std::move(table), std::move(secret)};
}

}  // namespace strata::pmix
