#!/usr/bin/env bash
# Runs a test program as NP ranks under Open MPI's mpirun (a PMIx server); meson uses it for the
# pmix suite.
#
# Usage: run-mpirun.sh NP PROGRAM [ARGS...]
#
# Loopback only: Open MPI's own traffic (oob, btl) is pinned to lo, and so are strata's mesh
# (STRATA_BOOTSTRAP_TCP_INTERFACE), libfabric and UCX. When mpirun is missing it prints one line
# and exits 77, which meson reports as a skipped test. Otherwise it returns mpirun's exit status.
set -uo pipefail

skip() {
  echo "SKIP: $*"
  exit 77
}

if [[ $# -lt 2 || ! $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 NP PROGRAM [ARGS...]" >&2
  exit 2
fi
np=$1
shift

command -v mpirun >/dev/null 2>&1 || skip "mpirun not found (install openmpi-bin: tools/dev/install-deps.sh)"

# A job or PMIx server of an outer launcher (srun, another mpirun) must not leak into this one.
for v in $(compgen -e SLURM_) $(compgen -e PMIX_) $(compgen -e OMPI_); do unset "$v"; done

# Loopback only, whatever the test's own environment says.
export STRATA_BOOTSTRAP_TCP_INTERFACE=lo FI_TCP_IFACE=lo UCX_NET_DEVICES=lo

# Forward strata's, Boost.Test's and the loopback pins' variables explicitly (-x), so that the
# ranks see them even if mpirun starts them through its daemon.
forward=()
for v in $(compgen -e); do
  case $v in
    STRATA_* | BOOST_TEST_* | FI_TCP_IFACE | UCX_NET_DEVICES | UCX_TLS | LD_LIBRARY_PATH | ASAN_OPTIONS | LSAN_OPTIONS | UBSAN_OPTIONS)
      forward+=(-x "$v")
      ;;
  esac
done

# mpirun refuses to run as root without these; CI runs as root.
exec timeout --kill-after=10 "${STRATA_MPIRUN_TIME:-600}" \
  mpirun --allow-run-as-root --oversubscribe -np "$np" \
  --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
  "${forward[@]}" "$@"
