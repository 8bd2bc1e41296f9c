# Sourced by run-srun.sh and the slurm-multinode tests: find_slurm_nodes_env REPO prints the env
# file of the local multi-node Slurm (tools/dev/slurm-up.sh --nodes): $STRATA_SLURM_NODES_STATE/env,
# else ./slurm-nodes/env inside a meson build directory, else REPO/build/slurm-nodes/env; nothing
# when none exists.
find_slurm_nodes_env() {
  local f
  for f in ${STRATA_SLURM_NODES_STATE:+"$STRATA_SLURM_NODES_STATE/env"} \
    $([[ -d meson-private ]] && echo "$PWD/slurm-nodes/env") "$1/build/slurm-nodes/env"; do
    if [[ -r $f ]]; then
      echo "$f"
      return 0
    fi
  done
  return 0
}
