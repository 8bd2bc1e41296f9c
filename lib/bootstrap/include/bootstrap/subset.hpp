#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "bootstrap/subset.hpp is internal to strata: applications include <strata/...> only"
#endif

// A bootstrap over some ranks of another one (Communicator::shrink): no new rendezvous, no
// listener, nothing through a rank that is not a member. Rank i of the subset is parent rank
// members[i]; its messages travel over the parent's point-to-point calls between the members,
// all on one parent tag that the members chose together (every subset of one parent needs its
// own), each as a header (the subset's tag, the length) and the payload. Its collectives are
// direct exchanges between the members. Errors name subset ranks (peer()) and say which parent
// rank that is. abort() tells every member; a member that learns of it tells the others in turn
// when it aborts (shrink does, as it leaves a failed attempt), so that no member stays blocked on
// a rank that has moved on.

#include <cstdint>
#include <memory>
#include <vector>

#include <strata/bootstrap.hpp>
#include <strata/config.hpp>
#include <strata/export.hpp>

namespace strata::bootstrap {

struct SubsetOptions {
  /// Parent ranks, ascending, this rank's among them; the same list on every member.
  std::vector<int> members;
  /// The parent tag of this subset's messages (>= 0; the same on every member).
  int tag = 0;
  int localRank = 0;  ///< among the members on this host
  int localSize = 1;
};

/// The subset, unwatched (watchSubset opens its watch scope). Not collective: the first call
/// that needs a member waits for it. InvalidArgument for a bad member list or tag.
STRATA_API std::unique_ptr<Bootstrap> subset(std::shared_ptr<Bootstrap> parent,
                                             SubsetOptions options);
/// A bootstrap that forwards every call to `b`, which the caller keeps as well (shrink aborts the
/// subset of a failed attempt after the communicator that owned it is gone).
STRATA_API std::unique_ptr<Bootstrap> sharing(std::shared_ptr<Bootstrap> b);
/// Opens the subset's watch scope (one allGather over it) as attachWatch does for a new
/// bootstrap; its status port listens on bootstrap.tcp.interface, else on the interface of the
/// parent's (`parent`'s scope).
STRATA_API std::unique_ptr<Bootstrap> watchSubset(std::unique_ptr<Bootstrap> subset,
                                                  const Bootstrap& parent, const Config& config);

}  // namespace strata::bootstrap
