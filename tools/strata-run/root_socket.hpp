#pragma once

// Rank 0's root listener, which strata-run binds itself and hands down as an open fd, and the
// free port that --torch gives torch's own rendezvous.

#include <string>

#include "io.hpp"
#include "options.hpp"

namespace strata::run {

/// Binds and listens on --root-host:--root-port (port 0: any free one). On success `listener`
/// is the close-on-exec socket, `address` its "host:port" (or "[v6]:port") as the library parses
/// it and `boundPort` the port; else `error` says why and what to change.
bool openRootSocket(const Options& options, Fd& listener, std::string& address, int& boundPort,
                    std::string& error);

/// A free TCP port on `host` (never `avoid`), reserved for as long as `hold` stays open: it is
/// bound with SO_REUSEADDR and not listening, so no other process gets the port while a listener
/// that also sets SO_REUSEADDR (torch's TCPStore) can still take it. False with `error` saying why.
bool pickFreePort(const std::string& host, int avoid, int& port, Fd& hold, std::string& error);

}  // namespace strata::run
