#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "base/process.hpp is internal to strata: applications include <strata/...> only"
#endif

// Facts about this process and its host that every layer may need: the host name, whether
// another process has exited, and the open-file limit a job of N ranks needs.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <strata/export.hpp>

namespace strata::process {

/// This host's name as gethostname() gives it (in this UTS namespace), or "unknown".
STRATA_API std::string hostName();

/// Whether the process has exited: no such pid, or a zombie not yet reaped by its parent (the
/// shm transport's pidfd reports the exit at once, before the launcher reaps it).
STRATA_API bool gone(pid_t pid);

/// Descriptors one process of a job of `ranks` ranks holds at most: two bootstrap sockets and
/// one transport handle (the shm transport's pidfd) per peer, plus a margin for the rest.
STRATA_API uint64_t descriptorsNeeded(int ranks);
/// What to tell the user when a socket or open failed with EMFILE/ENFILE: the count, the
/// limits, what a job of `ranks` needs and how to raise the limit.
STRATA_API std::string descriptorAdvice(int ranks);
/// True when an error text carries EMFILE's or ENFILE's strerror.
STRATA_API bool outOfDescriptors(std::string_view text);
/// Raises this process's soft RLIMIT_NOFILE to descriptorsNeeded(ranks), up to the hard limit,
/// before a job opens its sockets (a default `ulimit -n 1024` would fail 512 ranks half-way
/// through set-up); when the hard limit is lower, rank 0 warns once with what to do.
STRATA_API void ensureDescriptors(int ranks, int rank, const char* logName);

/// The CPUs of a Linux CPU list ("0-3,8,10-11"), sorted and unique. Throws InvalidConfig naming
/// `what` (the key it came from) for anything else, or a CPU above 65535.
STRATA_API std::vector<int> parseCpuList(std::string_view text, std::string_view what);
/// The list form of cpus ("0-3,8"); "" for none.
STRATA_API std::string cpuListText(const std::vector<int>& cpus);
/// The CPUs the calling thread may run on (its affinity mask: what srun --cpu-bind, taskset or
/// numactl gave it), sorted; empty with *why set when sched_getaffinity failed.
STRATA_API std::vector<int> allowedCpus(std::string* why = nullptr);
/// Binds the calling thread to those of `cpus` the process may use (its current mask).
/// Returns what it bound to ("0-3"), or "" with *why set when nothing was bound (none of them
/// allowed, or sched_setaffinity failed). Empty cpus: nothing to do, "" and no why.
STRATA_API std::string pinCurrentThread(const std::vector<int>& cpus, std::string* why);
/// Names the calling thread (15 characters at most; longer names are cut), for top -H, gdb and
/// /proc/PID/task/TID/comm.
STRATA_API void nameCurrentThread(const char* name);
/// The start of a strata thread: names it and binds it to cpus (transport.proxy_cpus; empty:
/// unbound), saying at warn level when nothing could be bound and at debug where it runs.
/// subsystem and who ("the proxy thread") are for those lines.
STRATA_API void startThread(const char* name, const std::vector<int>& cpus,
                            std::string_view subsystem, std::string_view who);

}  // namespace strata::process
