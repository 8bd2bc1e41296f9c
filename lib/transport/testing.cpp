#include "transport/testing.hpp"

#include "internal.hpp"

namespace strata::transport::testing {

RegisteredMemory fakeMemory(bool local, void* data, size_t bytes, int rank,
                            const std::string& transportName) {
  auto impl = std::make_shared<RegisteredMemory::Impl>();
  impl->local = local;
  impl->rank = local ? 0 : rank;
  impl->data = local ? data : nullptr;
  impl->size = bytes;
  if (!local) impl->remoteTransport = transportName;
  return RegisteredMemory(std::move(impl));
}

std::shared_ptr<Connection> connectionOver(int peer, const std::string& transportName,
                                           std::unique_ptr<backend::TransportConnection> conn) {
  auto impl = std::make_unique<Connection::Impl>();
  impl->peer = peer;
  impl->transportName = transportName;
  impl->conn = std::move(conn);
  return std::make_shared<Connection>(std::move(impl));
}

}  // namespace strata::transport::testing
