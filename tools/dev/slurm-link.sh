#!/usr/bin/env bash
# Cuts or heals a node's link to the data network of the local multi-node Slurm that
# tools/dev/slurm-up.sh --nodes started in STATE_DIR: the switch's port of that node goes down (the
# node's data0 loses its carrier; packets stop both ways, no connection is reset) or up again.
# The control network, which Slurm uses, stays up. See docs/local-slurm.md.
#
# Usage: tools/dev/slurm-link.sh STATE_DIR NODE down|up|show
set -uo pipefail

die() {
  echo "slurm-link: error: $*" >&2
  exit 1
}

[[ $# -eq 3 ]] || die "usage: $0 STATE_DIR NODE down|up|show"
state=$1 node=$2 action=$3
[[ -r $state/links && -r $state/netns ]] ||
  die "$state is not a multi-node local Slurm (no links file; start one with slurm-up.sh --nodes N)"
[[ $action =~ ^(down|up|show)$ ]] || die "the action is down, up or show (got '$action')"
head_ns=$(head -n1 "$state/netns")
# links: "NODE NAMESPACE SWITCH-PORT DATA-ADDRESS" per node.
port=$(awk -v n="$node" '$1 == n { print $3 }' "$state/links")
[[ -n $port ]] || die "no node '$node' in $state/links (nodes: $(awk '{ printf "%s ", $1 }' "$state/links"))"
if [[ $action == show ]]; then
  ip -n "$head_ns" -br link show "$port"
else
  ip -n "$head_ns" link set "$port" "$action" || die "could not set $port $action in $head_ns"
  echo "slurm-link: $node's data link is $action"
fi
