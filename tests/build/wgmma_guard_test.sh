#!/usr/bin/env bash
# cmake/wgmma_guard.sh with a stand-in compiler (no nvcc needed): a clean compile passes with its
# output and exit code; one whose log holds ptxas's C7511 line fails, and its object is removed so
# that the next build compiles it again; a failing compile keeps its own exit code.
set -euo pipefail
guard=$(cd "$(dirname "$0")/../.." && pwd)/cmake/wgmma_guard.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The stand-in writes its -o object and prints $MESSAGE to stderr, then exits $CODE.
cat >"$work/cc" <<'CC'
#!/usr/bin/env bash
prev=""
for a in "$@"; do [[ $prev == -o ]] && echo object >"$a"; prev=$a; done
[[ -n ${MESSAGE:-} ]] && echo "$MESSAGE" >&2
exit "${CODE:-0}"
CC
chmod +x "$work/cc"
fail() { echo "wgmma_guard_test: $*"; exit 1; }

MESSAGE="ptxas info    : Used 168 registers" "$guard" "$work/cc" -c a.cu -o "$work/a.o" \
  2>"$work/err" || fail "a clean compile failed"
[[ -f $work/a.o ]] || fail "a clean compile lost its object"
grep -q "Used 168 registers" "$work/err" || fail "the compiler's messages were not passed on"

serialized="ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized due to insufficient register resources for the wgmma pipeline in the function 'k'"
if MESSAGE=$serialized "$guard" "$work/cc" -c b.cu -o "$work/b.o" 2>"$work/err"; then
  fail "a compile with C7511 passed"
fi
[[ ! -e $work/b.o ]] || fail "the object of a compile with C7511 was kept"
grep -q "C7511" "$work/err" || fail "ptxas's line was not shown"
grep -q "error: ptxas serialized wgmma" "$work/err" || fail "no error line"

set +e
CODE=3 "$guard" "$work/cc" -c c.cu -o "$work/c.o" 2>/dev/null
code=$?
set -e
((code == 3)) || fail "a failing compile exited $code, not its own 3"
echo "wgmma_guard_test: 3 cases passed"
