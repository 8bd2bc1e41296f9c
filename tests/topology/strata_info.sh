#!/bin/bash
# strata-info --topology and --check as a user runs them (docs/topology.md): on the DGX-like
# recorded machine GPU i takes NIC mlx5_i with its socket's cores; the pre-flight of its ACS
# sysfs tree warns; on this machine the transports add their own lines.
#   strata_info.sh STRATA_INFO DATA_DIR NVLINK FABRIC   (yes|no: the module was built)
set -u
info=$1 data=$2 nvlink=$3 fabric=$4
fail=0
expect() {  # expect TEXT WHAT: TEXT contains WHAT
  if ! grep -qF -- "$2" <<<"$1"; then
    echo "FAIL: no line with: $2"
    fail=1
  fi
}
out=$("$info" --topology --topology-file "$data/dgx-h100.xml") || { echo "FAIL: --topology"; exit 1; }
for i in 0 1 2 3 4 5 6 7; do
  cores="0-55,112-167"
  [ "$i" -ge 4 ] && cores="56-111,168-223"
  expect "$out" "local rank $i: GPU $i, NIC mlx5_$i, cpus $cores, proxy cpus $cores, NUMA node $((i / 4)): nearest (PIX"
done
# An exclusion moves GPU 0 to the next nearest NIC (the one behind its switch's neighbour).
out=$(STRATA_TRANSPORT_FABRIC_NIC=^mlx5_0 "$info" --topology --topology-file "$data/dgx-h100.xml")
expect "$out" "local rank 0: GPU 0, NIC mlx5_1"
# A recorded machine's pre-flight: ACS redirect on the bridges, transports not asked.
out=$("$info" --check --topology-file "$data/dgx-h100.xml" --sysfs "$data/sysfs-dgx-acs")
expect "$out" "WARN PCIe ACS "
expect "$out" "transports: not asked"
# This machine: the topology's lines and the transports' (fabric: FI_HMEM per domain).
out=$("$info" --check) || { echo "FAIL: --check"; exit 1; }
expect "$out" "topology: this machine"
if [ "$fabric" = yes ]; then
  expect "$out" "fabric provider: "
  expect "$out" " domain lo: "
fi
if [ "$nvlink" = yes ]; then
  expect "$out" " CUDA: "
fi
# A bad file is a clear error, not a crash.
if err=$("$info" --topology --topology-file /nonexistent.xml 2>&1); then
  echo "FAIL: a missing file was accepted"
  fail=1
fi
expect "$err" "/nonexistent.xml"
[ "$fail" = 0 ] && echo "strata-info --topology and --check: all lines found"
exit "$fail"
