#pragma once

// Where the ranks' output goes: inherited, relayed line by line with a "[r] " tag
// (--tag-output), or written to one file per rank and stream (--output-dir).

#include <unistd.h>

#include <string>

#include "io.hpp"
#include "options.hpp"

namespace strata::run {

/// One relayed output stream of one rank (--tag-output).
struct Stream {
  Fd fd;  ///< the read end of the rank's pipe; closed once the stream has ended
  int target = STDOUT_FILENO;
  std::string pending;  ///< the incomplete last line
};

/// --output-dir: creates the directory. False after saying why.
bool createOutputDir(const std::string& dir);

/// Opens what rank r writes to: with --tag-output two pipes, whose read ends go to out and err
/// and write ends to outWrite and errWrite; with --output-dir DIR/rank-<r>.out and .err as
/// outWrite and errWrite; else nothing (the rank inherits strata-run's streams). False after
/// saying why.
bool openRankOutput(const Options& options, int r, Stream& out, Stream& err, Fd& outWrite,
                    Fd& errWrite);

/// Reads what rank `rankIndex` wrote to `stream` and emits its complete lines, tagged. `drain`:
/// reads what is there without waiting for end-of-file, emits the last partial line and ends
/// the stream.
void relayStream(int rankIndex, Stream& stream, bool drain);

}  // namespace strata::run
