#!/usr/bin/env bash
# Runs a test program as NTASKS Slurm tasks; meson uses it for the `slurm` suite.
#
# Usage: run-srun.sh [SRUN_OPTION...] NTASKS PROGRAM [ARGS...]
#   SRUN_OPTIONs start with "--" and go to srun, after the defaults, so they win:
#   e.g. --mpi=pmix, --time=10. The default is --mpi=none.
#
# It uses the Slurm named by $SLURM_CONF, else $STRATA_SLURM_STATE/env, else ./slurm/env when run
# from a meson build directory, else <repo>/build/slurm/env (all written by tools/dev/slurm-up.sh).
# When no Slurm answers or srun is missing it prints one line and exits 77, which meson reports as
# a skipped test. Otherwise it returns srun's exit status (the highest task exit status; 77 from
# every task is a skip).
#
# STRATA_SRUN_NODES=N (suite slurm-multinode): the job spans N nodes (srun --nodes=N) of the local
# multi-node Slurm (tools/dev/slurm-up.sh --nodes), found at $STRATA_SLURM_NODES_STATE/env, else
# ./slurm-nodes/env in a meson build directory, else <repo>/build/slurm-nodes/env; SLURM_CONF and
# STRATA_SLURM_STATE are ignored then. Its jobs talk over the nodes' data network (data0), not lo.
set -uo pipefail

skip() {
  echo "SKIP: $*"
  exit 77
}

srun_opts=()
while [[ $# -gt 0 && $1 == --* ]]; do
  srun_opts+=("$1")
  shift
done
if [[ $# -lt 2 || ! $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 [SRUN_OPTION...] NTASKS PROGRAM [ARGS...]" >&2
  exit 2
fi
ntasks=$1
shift

command -v srun >/dev/null 2>&1 || skip "srun not found (install slurm-client: tools/dev/install-deps.sh)"

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
use_env_file() {  # file: a local test Slurm's env file
  # Job variables inherited from an outer allocation (another cluster) would confuse srun.
  local v
  for v in $(compgen -e SLURM_); do unset "$v"; done
  # shellcheck disable=SC1090
  . "$1"
}
nodes=${STRATA_SRUN_NODES:-}
if [[ -n $nodes ]]; then
  [[ $nodes =~ ^[1-9]$ ]] || { echo "run-srun: STRATA_SRUN_NODES must be 1..9 (got '$nodes')" >&2; exit 2; }
  unset SLURM_CONF
  # shellcheck source=find-slurm-nodes.sh
  . "$repo/tests/harness/find-slurm-nodes.sh"
  found=$(find_slurm_nodes_env "$repo")
  [[ -n $found ]] || skip "no local multi-node Slurm is up (start one with tools/dev/slurm-up.sh --nodes 2 BUILD_DIR/slurm-nodes, or run tools/dev/run-tests.sh)"
  use_env_file "$found"
  [[ ${STRATA_SLURM_NODES:-0} -ge $nodes ]] ||
    skip "the local Slurm at $found has ${STRATA_SLURM_NODES:-1} node(s); this test needs $nodes"
elif [[ -n ${SLURM_CONF:-} ]]; then
  [[ -r $SLURM_CONF ]] || skip "SLURM_CONF=$SLURM_CONF is not readable"
elif [[ -n ${STRATA_SLURM_STATE:-} && -r $STRATA_SLURM_STATE/env ]]; then
  use_env_file "$STRATA_SLURM_STATE/env"
elif [[ -d meson-private && -r slurm/env ]]; then
  use_env_file "$PWD/slurm/env"
elif [[ -r $repo/build/slurm/env ]]; then
  use_env_file "$repo/build/slurm/env"
else
  skip "no local Slurm is up (start one with tools/dev/slurm-up.sh BUILD_DIR/slurm, or run tools/dev/run-tests.sh)"
fi

if ! ping=$(timeout 15 scontrol ping 2>&1) || [[ $ping != *UP* ]]; then
  skip "Slurm at ${SLURM_CONF:-default config} does not answer (scontrol ping: ${ping//$'\n'/ })"
fi

# Loopback only, whatever the test's own environment says; the data network between the
# namespace nodes of a multi-node Slurm.
if [[ -n $nodes ]]; then
  iface=${STRATA_SLURM_DATA_IFACE:-data0}
  export STRATA_BOOTSTRAP_TCP_INTERFACE="=$iface" FI_TCP_IFACE=$iface UCX_NET_DEVICES=$iface
  srun_opts=("--nodes=$nodes" "${srun_opts[@]}")
else
  export STRATA_BOOTSTRAP_TCP_INTERFACE=lo FI_TCP_IFACE=lo UCX_NET_DEVICES=lo
fi

# --export=ALL: the test's environment from meson (STRATA_MODULE_PATH, STRATA_CONFIG, ...) must reach
# every task even if the caller has SLURM_EXPORT_ENV set.
exec srun -O -n "$ntasks" --resv-ports="$ntasks" --mpi=none --kill-on-bad-exit=1 \
  --time="${STRATA_SRUN_TIME:-10}" --export=ALL --job-name="strata-$(basename "$1")" \
  "${srun_opts[@]}" "$@"
