#!/usr/bin/env bash
# gpu-bundle.sh — builds here what tools/dev/gpu-check.sh runs on a GPU machine, and packs it
# with every shared library it loads except glibc's and the NVIDIA driver's, so that the check
# runs there with no build, no compiler and no -dev package (the lent GPU machine has none of
# fmt, toml++, OpenSSL or Boost, and no package registry; docs/testing.md, "GPU check").
#
# Usage: tools/dev/gpu-bundle.sh [--build DIR] [DEST]
#   DEST     the bundle folder (default gpu-bundle, replaced); under 64 MiB (the device tool's
#            carry limit): the script fails when it is not.
#   --build  an existing build folder to take the programs from (built there if needed).
#            Default: build-bundle, configured here as a release build with CUDA and tests, and
#            without the PMIx, UCX and libfabric modules (the check does not use them, and they
#            would pull in their libraries).
#   --no-build  take the programs as they are in --build (the CI test: meson built them, and
#            no second ninja may run in the build folder while meson test runs).
# Layout: bin/ (test-nvlink, test-nvlink-records, test-cuda-collectives, strata-run,
# strata-perf, strata-info, cuda_baseline), lib/ (libstrata.so.0 and the carried libraries),
# lib/strata/ (the modules, where libstrata looks first), gpu-check.sh and MANIFEST (what, from
# which commit, sizes). Everything is stripped.
#
# Then, on the GPU machine, from the repository root:
#   tools/dev/gpu-check.sh --bundle gpu-bundle
# (device tool: carry ["gpu-bundle"]).

set -euo pipefail
cd "$(dirname "$0")/../.." || exit 1
BUILD=build-bundle
OWN_BUILD=1
NO_BUILD=0
while [ $# -gt 0 ]; do
  case $1 in
    --build) BUILD=$2; OWN_BUILD=0; shift 2 ;;
    --no-build) NO_BUILD=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    -*) echo "gpu-bundle: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
DEST=${1:-gpu-bundle}
LIMIT=$((64 * 1024 * 1024))
export PATH=/usr/local/cuda/bin:$PATH

if [ "$OWN_BUILD" = 1 ]; then
  opts=(-Dbuildtype=release -Dcuda=enabled -Dtests=enabled -Dpmix=disabled -Ducx=disabled
        -Dlibfabric=disabled -Dtorch=disabled --wrap-mode=nodownload)
  if [ -f "$BUILD/build.ninja" ]; then
    meson setup --reconfigure "$BUILD" "${opts[@]}" >/dev/null
  else
    meson setup "$BUILD" "${opts[@]}" >/dev/null
  fi
fi
[ -f "$BUILD/build.ninja" ] || { echo "gpu-bundle: $BUILD is not a meson build folder" >&2; exit 1; }

PROGRAMS=(tests/gpu/test-nvlink tests/gpu/test-nvlink-records tests/gpu/test-cuda-collectives
          tools/strata-run/strata-run tools/strata-perf/strata-perf tools/strata-info/strata-info)
# The NCCL API (bindings/nccl), when built: the check runs it on device memory and under PyTorch.
NCCL_LIB=bindings/nccl/libstrata-nccl.so.2
MODULES=(backends/transport/nvlink/strata-transport-nvlink.so
         collectives/cuda/strata-collectives-cuda.so)
if [ "$NO_BUILD" = 1 ]; then
  for t in "${PROGRAMS[@]}" "${MODULES[@]}"; do
    [ -f "$BUILD/$t" ] || { echo "gpu-bundle: $BUILD/$t is not built" >&2; exit 1; }
  done
else
  targets=$(ninja -C "$BUILD" -t targets all 2>/dev/null | sed 's/: .*//')
  for t in "${PROGRAMS[@]}" "${MODULES[@]}"; do
    if ! grep -qxF "$t" <<<"$targets"; then
      echo "gpu-bundle: $BUILD has no target $t (is CUDA found? are the tests enabled?)" >&2
      exit 1
    fi
  done
  ninja -C "$BUILD" "${PROGRAMS[@]}" "${MODULES[@]}" >/dev/null
  if grep -qxF "$NCCL_LIB" <<<"$targets"; then ninja -C "$BUILD" "$NCCL_LIB" >/dev/null; fi
fi
# The baseline is plain CUDA: built for the GPUs the lent machine may have (H100/H200: sm_90;
# sm_80 for A100s), not -arch=native (there is no GPU here).
nvcc -O2 -std=c++17 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
  -o "$BUILD/cuda_baseline" tools/bench/cuda_baseline.cu

rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib/strata"
for p in "${PROGRAMS[@]}"; do cp "$BUILD/$p" "$DEST/bin/"; done
cp "$BUILD/cuda_baseline" "$DEST/bin/"
for m in "${MODULES[@]}"; do cp "$BUILD/$m" "$DEST/lib/strata/"; done
cp -L "$BUILD/lib/libstrata.so.0" "$DEST/lib/"
if [ -e "$BUILD/$NCCL_LIB" ]; then cp -L "$BUILD/$NCCL_LIB" "$DEST/lib/"; fi
cp tools/dev/gpu-check.sh "$DEST/"

# glibc (and the dynamic loader) come from the machine, and so does the driver: libcuda and
# the libnvidia-* it loads must match the kernel module there.
system_lib() {
  case $(basename "$1") in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libresolv.so.*|libutil.so.*) return 0 ;;
    ld-linux*|linux-vdso*) return 0 ;;
    libcuda.so*|libnvidia-*) return 0 ;;
  esac
  return 1
}
# Every library the programs and modules load (ldd lists the whole closure), copied once.
for f in "$DEST"/bin/* "$DEST"/lib/strata/*.so "$DEST/lib/libstrata.so.0" "$DEST"/lib/libstrata-nccl.so.*; do
  [ -e "$f" ] || continue
  while read -r name path; do
    [ -n "$path" ] || continue
    system_lib "$name" && continue
    [ "$name" = libstrata.so.0 ] && continue
    [ -e "$DEST/lib/$name" ] || cp -L "$path" "$DEST/lib/$name"
  done < <(LD_LIBRARY_PATH="$DEST/lib" ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
done
find "$DEST" -type f \( -name '*.so*' -o -perm -u+x \) ! -name '*.sh' -exec strip --strip-unneeded {} + 2>/dev/null || true

{
  echo "# strata GPU bundle: tools/dev/gpu-check.sh --bundle <this folder>"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) from $BUILD ($(meson introspect --buildoptions "$BUILD" 2>/dev/null | python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="buildtype"))' 2>/dev/null || echo '?'))"
  echo "files:"
  (cd "$DEST" && find . -type f ! -name MANIFEST -printf '  %p %s\n' | sort)
} >"$DEST/MANIFEST"

size=$(du -sb "$DEST" | cut -f1)
echo "gpu-bundle: $DEST, $(find "$DEST" -type f | wc -l) files, $((size / 1024)) KiB"
if [ "$size" -ge "$LIMIT" ]; then
  echo "gpu-bundle: $DEST is $size bytes, over the device tool's 64 MiB carry limit" >&2
  exit 1
fi
