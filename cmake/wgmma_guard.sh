#!/usr/bin/env bash
# CUDA compiler launcher of FP8MLA_WGMMA_GUARD: runs the compile it is given and fails it when
# ptxas reports wgmma instructions serialized (C7511, "insufficient register resources for the
# wgmma pipeline"). ptxas prints that as an info line and still builds the kernel, which then
# waits for each wgmma before the next: the attention kernels run far slower. A change anywhere
# in a consumer's code can cause it (docs/design.md, op 8), so the project's own builds check.
set -uo pipefail
log=$(mktemp)
"$@" 2>"$log"
rc=$?
cat "$log" >&2
if ((rc == 0)) && grep -q "C7511" "$log"; then
  object="" previous=""
  for arg in "$@"; do
    [[ "$previous" == "-o" ]] && object=$arg
    previous=$arg
  done
  # Without its object the next build compiles the file again (and fails again).
  [[ -n "$object" ]] && rm -f "$object"
  echo "error: ptxas serialized wgmma instructions (C7511) compiling ${object:-a CUDA file};" \
    "the kernel would run, slower (FP8MLA_WGMMA_GUARD)" >&2
  rc=1
fi
rm -f "$log"
exit "$rc"
