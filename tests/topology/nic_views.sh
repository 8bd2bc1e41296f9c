#!/bin/bash
# The ranks of a host place themselves from what each says about itself (its GPU through
# CUDA_VISIBLE_DEVICES, its NUMA binding), exchanged at create, not from guesses: four ranks on
# two "hosts" (transport.host_id) of the recorded DGX-like machine, each host's two ranks given
# GPUs against the local-rank order, one visible GPU each (srun --gpus-per-task) or a device
# named in a list. Each must wish its own GPU's NIC (docs/topology.md); a rank that guessed its
# neighbour on GPU (local rank) would give rank 1 or 3 mlx5_1.
#   nic_views.sh STRATA_RUN STRATA_PERF DGX_XML
set -u
run=$1 perf=$2 xml=$3
out=$(STRATA_TOPOLOGY_FILE=$xml STRATA_TRANSPORT_PROXY_CPUS=none STRATA_LOG_LEVEL=debug \
  "$run" -n 4 --grace 10 --tag-output bash -c '
    # Rank 2 names its device (transport.cuda.device) in a list of two.
    case $STRATA_RANK in 0) v=3 ;; 1) v=0 ;; 2) v=7,6; export STRATA_TRANSPORT_CUDA_DEVICE=1 ;; 3) v=0 ;; esac
    CUDA_VISIBLE_DEVICES=$v STRATA_TRANSPORT_HOST_ID=host$((STRATA_RANK / 2)) \
      exec "$0" allreduce -b 8 -e 8 -n 1 -w 0' "$perf" 2>&1)
rc=$?
fail=0
[ $rc = 0 ] || { echo "FAIL: the job exited $rc"; fail=1; }
for want in "rank 0: NIC mlx5_3 for local rank 0 (GPU 3)" "rank 1: NIC mlx5_0 for local rank 1 (GPU 0)" \
            "rank 2: NIC mlx5_6 for local rank 0 (GPU 6)" "rank 3: NIC mlx5_0 for local rank 1 (GPU 0)"; do
  grep -qF "$want" <<<"$out" || { echo "FAIL: no line: $want"; fail=1; }
done
if [ $fail != 0 ]; then
  grep -E "topology|NIC|rror" <<<"$out" | head -40
  exit 1
fi
echo "every rank wished its own GPU's NIC"
