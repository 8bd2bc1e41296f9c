#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "launch/hostlist.hpp is internal to strata: applications include <strata/...> only"
#endif

// Slurm's compressed host-list and related launcher syntaxes, parsed in code.

#include <string>
#include <string_view>
#include <vector>

#include <strata/export.hpp>

namespace strata::hostlist {

/// "n[01-03,07],gpu-a[1-2]-ib,login" -> n01 n02 n03 n07 gpu-a1-ib gpu-a2-ib login.
/// Zero padding of the lower bound is kept; several bracket groups in one name are expanded
/// in order. Throws Error(InvalidArgument) for unbalanced brackets, empty ranges, reversed
/// ranges or more than `maxHosts` hosts.
STRATA_API std::vector<std::string> expand(std::string_view list, size_t maxHosts = 1u << 20);
/// The first host only, without expanding the whole list.
STRATA_API std::string first(std::string_view list);
/// SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE: "2(x3),1" -> 2 2 2 1.
STRATA_API std::vector<int> tasksPerNode(std::string_view text);
/// SLURM_STEP_RESV_PORTS: "12000-12003,12010" -> 12000 12001 12002 12003 12010.
STRATA_API std::vector<int> ports(std::string_view text);

}  // namespace strata::hostlist
