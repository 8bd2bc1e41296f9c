#!/bin/bash
# check_abi.sh LIBRARY NCCL_H: the library exports exactly the functions nccl.h declares, each as
# nccl* and pnccl*, and nothing else; ncclUniqueId is NCCL's 128 bytes.
set -euo pipefail
lib=$1 header=$2
want=$(grep -oE '^ *(ncclResult_t|const char\*) +nccl[A-Za-z]+\(' "$header" | grep -oE 'nccl[A-Za-z]+\(' | tr -d '(' | sort -u)
have=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort -u)
fail=0
for f in $want; do
  for name in "$f" "p$f"; do
    if ! grep -qx "$name" <<<"$have"; then echo "missing: $name"; fail=1; fi
  done
done
extra=$(grep -vxF -f <(for f in $want; do echo "$f"; echo "p$f"; done) <<<"$have" || true)
if [ -n "$extra" ]; then echo "exported but not in nccl.h:"; echo "$extra"; fail=1; fi
echo "nccl.h declares $(wc -w <<<"$want") functions; the library exports $(wc -l <<<"$have") symbols"
# Sizes, from a C program compiled against the same header.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/sizes.c" <<'C'
#include <nccl.h>
#include <stdio.h>
int main(void) {
  printf("%zu %zu %zu\n", sizeof(ncclUniqueId), sizeof(ncclConfig_t), sizeof(ncclSimInfo_t));
  return 0;
}
C
cc -I"$(dirname "$header")" "$tmp/sizes.c" -o "$tmp/sizes"
read -r id config sim < <("$tmp/sizes")
echo "sizeof ncclUniqueId $id, ncclConfig_t $config, ncclSimInfo_t $sim"
[ "$id" = 128 ] || { echo "ncclUniqueId is $id bytes, NCCL's is 128"; fail=1; }
# The library reads ncclConfig_t as this header lays it out (it checks magic and size).
[ "$config" -ge 56 ] || { echo "ncclConfig_t is $config bytes: not 2.28's layout"; fail=1; }
exit $fail
