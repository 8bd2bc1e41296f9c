#include <strata/error.hpp>

namespace strata {

std::string_view toString(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::InvalidArgument: return "InvalidArgument";
    case ErrorCode::InvalidConfig: return "InvalidConfig";
    case ErrorCode::NotSupported: return "NotSupported";
    case ErrorCode::Timeout: return "Timeout";
    case ErrorCode::PeerLost: return "PeerLost";
    case ErrorCode::ProtocolError: return "ProtocolError";
    case ErrorCode::AuthFailed: return "AuthFailed";
    case ErrorCode::Aborted: return "Aborted";
    case ErrorCode::SystemError: return "SystemError";
    case ErrorCode::BackendError: return "BackendError";
    case ErrorCode::Internal: return "Internal";
  }
  return "Unknown";
}

Error::Error(ErrorCode code, const std::string& message, int peer)
    : std::runtime_error(message), code_(code), peer_(peer) {}

}  // namespace strata
