#include "relay.hpp"

#include <fcntl.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace strata::run {
namespace {

// A rank's partial line is held back until its newline arrives, but not without bound: a stream
// with no newlines at all (binary output) is cut into lines of this size.
constexpr size_t kMaxPendingLine = 1 << 20;
constexpr size_t kReadChunk = 64 * 1024;

void emitLines(int rankIndex, Stream& stream, bool final) {
  const std::string prefix = "[" + std::to_string(rankIndex) + "] ";
  std::string out;
  size_t start = 0;
  for (;;) {
    size_t nl = stream.pending.find('\n', start);
    if (nl == std::string::npos) break;
    out += prefix;
    out.append(stream.pending, start, nl + 1 - start);
    start = nl + 1;
  }
  stream.pending.erase(0, start);
  if (!stream.pending.empty() && (final || stream.pending.size() >= kMaxPendingLine)) {
    out += prefix + stream.pending + '\n';
    stream.pending.clear();
  }
  // Whole lines in one write: a line from one rank is never split by another's.
  if (!out.empty()) writeAll(stream.target, out);
}

}  // namespace

bool createOutputDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    say("cannot create --output-dir '" + dir + "': " + ec.message());
    return false;
  }
  return true;
}

bool openRankOutput(const Options& options, int r, Stream& out, Stream& err, Fd& outWrite,
                    Fd& errWrite) {
  if (options.output == OutputMode::Tag) {
    int p[2];
    for (Stream* stream : {&out, &err}) {
      if (::pipe2(p, O_CLOEXEC) != 0) {
        say("cannot create an output pipe for rank " + std::to_string(r) + ": " + errnoText(errno));
        return false;
      }
      ::fcntl(p[0], F_SETFL, ::fcntl(p[0], F_GETFL) | O_NONBLOCK);
      stream->fd = Fd(p[0]);
      (stream == &out ? outWrite : errWrite) = Fd(p[1]);
    }
    out.target = STDOUT_FILENO;
    err.target = STDERR_FILENO;
  } else if (options.output == OutputMode::Directory) {
    for (const char* suffix : {".out", ".err"}) {
      auto path = std::filesystem::path(options.outputDir) / ("rank-" + std::to_string(r) + suffix);
      Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666));
      if (!fd) {
        say("cannot create " + path.string() + ": " + errnoText(errno));
        return false;
      }
      (std::string_view(suffix) == ".out" ? outWrite : errWrite) = std::move(fd);
    }
  }
  return true;
}

void relayStream(int rankIndex, Stream& stream, bool drain) {
  char buf[kReadChunk];
  // Outside the final drain one read per wake-up, so that one chatty rank cannot starve others.
  for (int reads = 0; stream.fd && (drain ? reads < 1024 : reads < 1); ++reads) {
    ssize_t n = ::read(stream.fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {
      emitLines(rankIndex, stream, true);
      stream.fd.reset();
      break;
    }
    stream.pending.append(buf, static_cast<size_t>(n));
    emitLines(rankIndex, stream, false);
  }
  if (drain && stream.fd) {
    emitLines(rankIndex, stream, true);
    stream.fd.reset();
  }
}

}  // namespace strata::run
