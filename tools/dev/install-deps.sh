#!/usr/bin/env bash
# Installs every Debian 12 package strata needs to build and run its tests (including the local
# Slurm used by the `slurm` suite). Idempotent and quiet: when dpkg already reports every package
# installed it does nothing, not even `apt-get update`, so CI and developers can call it each time.
#
# Usage: tools/dev/install-deps.sh [--check]
#   --check   only report missing packages; exit 1 if any are missing.
set -euo pipefail

packages=(
  # toolchain and build system
  build-essential g++ meson ninja-build pkg-config git ca-certificates
  # the fuzz targets (tests/fuzz, CI's fuzz step): clang and its runtimes (libclang_rt.fuzzer,
  # asan, ubsan are in libclang-rt-14-dev, which clang only recommends)
  clang libclang-rt-14-dev
  # libraries the core and the backends build against
  libboost-test-dev libtomlplusplus-dev libfmt-dev libcli11-dev libssl-dev
  libpmix-dev libucx-dev libfabric-dev libfabric-bin libhwloc-dev
  # comparison benchmarks (Open MPI, Gloo), mpirun-launched tests, strata-plot
  openmpi-bin libopenmpi-dev libgloo-dev python3-matplotlib
  # strata_torch, the torch.distributed backend (bindings/torch) and its tests
  python3-torch libtorch-dev pybind11-dev python3-dev
  # local single-node Slurm for the `slurm` suite (tools/dev/slurm-up.sh)
  slurm-wlm slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge
  # scripts: ss/ip (port checks, network namespaces), ps, python3
  iproute2 procps python3 util-linux
)

missing=()
for p in "${packages[@]}"; do
  # `dpkg-query` prints "install ok installed" only for a fully configured package.
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

if [[ "${1:-}" == "--check" ]]; then
  echo "install-deps: missing packages: ${missing[*]}" >&2
  exit 1
fi

if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "install-deps: missing packages (${missing[*]}); run this script as root or install sudo" >&2
    exit 1
  fi
else
  sudo=()
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Debian's maintainer scripts would start munged/slurmd/slurmctld system services; the tests run
# their own instances (tools/dev/slurm-up.sh), so keep policy-rc.d from starting any service during
# the install, unless the machine already has its own policy.
policy=/usr/sbin/policy-rc.d
added_policy=0
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
  "${sudo[@]}" chmod 755 "$policy"
  added_policy=1
fi
cleanup() { if [[ $added_policy -eq 1 ]]; then "${sudo[@]}" rm -f "$policy"; fi; }
trap cleanup EXIT

apt_opts=(-q -y -o Dpkg::Use-Pty=0 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
log=$(mktemp)
if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" update >"$log" 2>&1 ||
   ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install \
       --no-install-recommends "${missing[@]}" >>"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "install-deps: apt-get failed (full log: $log); check the apt sources and network access" >&2
  exit 1
fi
rm -f "$log"

# Verify: a package that apt could not configure must not pass silently.
still=()
for p in "${missing[@]}"; do
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]]; then
    still+=("$p")
  fi
done
if [[ ${#still[@]} -ne 0 ]]; then
  echo "install-deps: still not installed after apt-get: ${still[*]}" >&2
  exit 1
fi
echo "install-deps: done"
