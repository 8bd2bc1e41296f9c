#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include <strata/export.hpp>

namespace strata {

/// What went wrong. Each code says what is still usable afterwards (docs/errors.md).
enum class ErrorCode {
  InvalidArgument,  ///< a bad argument from the caller; nothing changed
  InvalidConfig,    ///< a bad configuration key, value or file
  NotSupported,     ///< the build or the platform lacks the feature
  Timeout,          ///< a deadline passed; the object may be unusable
  PeerLost,         ///< a peer died or closed; calls that need it keep failing
  ProtocolError,    ///< a peer sent something malformed or unexpected
  AuthFailed,       ///< a connection did not prove knowledge of the job secret
  Aborted,          ///< a rank called abort(); the object is unusable
  SystemError,      ///< a system call failed
  BackendError,     ///< an external library (PMIx, UCX, libfabric, CUDA) failed
  Internal,         ///< a bug in strata
};

/// Name of an error code ("Timeout", ...).
STRATA_API std::string_view toString(ErrorCode code) noexcept;

/// The exception every strata call throws.
class STRATA_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message, int peer = -1);
  ErrorCode code() const noexcept { return code_; }
  /// The rank involved, or -1.
  int peer() const noexcept { return peer_; }

 private:
  ErrorCode code_;
  int peer_;
};

}  // namespace strata
