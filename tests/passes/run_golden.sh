#!/bin/sh
# Golden tests of the passes, as TAP. Each NAME.loom in the golden folder holds:
#   line 1      // RUN: PASSES [OPTIONS]   a pass list for `loom-ir opt --passes=PASSES`
#                                          (OPTIONS such as --print-after-each are passed on),
#               // RUN: plan               or `loom-ir plan` (the JIT pipeline's plan)
#   then        the input graph
#   // CHECK:   a line of its own, then the expected output, compared byte for byte
# Usage: run_golden.sh /path/to/loom-ir /path/to/golden
# Set LOOM_GOLDEN_UPDATE=1 to rewrite the expected parts from the current output (then
# review the diff: a golden file is only as good as its review).
set -u

if [ $# -ne 2 ]; then
    echo "usage: $0 /path/to/loom-ir /path/to/golden" >&2
    exit 2
fi
LOOM_IR=$1
GOLDEN=$2
TMP=$(mktemp -d "${TMPDIR:-/tmp}/loom-golden.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM

set -- "$GOLDEN"/*.loom
if [ ! -e "$1" ]; then
    echo "1..0 # SKIP no golden files in $GOLDEN"
    exit 0
fi
echo "1..$(($# + 1))"

n=0
failed=0
for f in "$@"; do
    n=$((n + 1))
    name=$(basename "$f" .loom)
    run=$(sed -n '1s|^// RUN: *||p' "$f")
    if [ -z "$run" ] || ! grep -q '^// CHECK:$' "$f"; then
        echo "not ok $n - $name: needs a first line '// RUN: ...' and a '// CHECK:' line"
        failed=$((failed + 1))
        continue
    fi
    # the input: line 2 up to the CHECK line; the expectation: everything after it
    sed -n '2,/^\/\/ CHECK:$/p' "$f" | sed '$d' >"$TMP/$name.in"
    sed '1,/^\/\/ CHECK:$/d' "$f" >"$TMP/$name.want"
    set -- $run
    if [ "$1" = plan ]; then
        "$LOOM_IR" plan "$TMP/$name.in" >"$TMP/$name.got" 2>"$TMP/$name.err"
    else
        passes=$1
        shift
        "$LOOM_IR" opt --passes="$passes" "$@" "$TMP/$name.in" >"$TMP/$name.got" \
            2>"$TMP/$name.err"
    fi
    rc=$?
    if [ "${LOOM_GOLDEN_UPDATE:-0}" = 1 ] && [ $rc -eq 0 ]; then
        { sed -n '1,/^\/\/ CHECK:$/p' "$f"; cat "$TMP/$name.got"; } >"$TMP/$name.new" &&
            cat "$TMP/$name.new" >"$f"
        cp "$TMP/$name.got" "$TMP/$name.want"
    fi
    if [ $rc -ne 0 ]; then
        echo "not ok $n - $name: loom-ir exited with $rc"
        sed 's/^/# /' "$TMP/$name.err"
        failed=$((failed + 1))
    elif ! diff -u "$TMP/$name.want" "$TMP/$name.got" >"$TMP/$name.diff"; then
        echo "not ok $n - $name: output differs from the CHECK part"
        sed 's/^/# /' "$TMP/$name.diff"
        failed=$((failed + 1))
    else
        echo "ok $n - $name ($run)"
    fi
done
# an unknown pass is a usage error that names the passes there are
n=$((n + 1))
printf 'loom.graph {\n  return\n}\n' >"$TMP/empty.loom"
"$LOOM_IR" opt --passes=dce,nope "$TMP/empty.loom" >"$TMP/unknown.out" 2>"$TMP/unknown.err"
rc=$?
if [ $rc -eq 2 ] && grep -q "unknown pass 'nope'; known passes: autocast, conv-decompose, dce, reduce-factor, cse, moments, fold, index-fold, reduce-split, matmul-casts, recompute" "$TMP/unknown.err" &&
    [ ! -s "$TMP/unknown.out" ]; then
    echo "ok $n - opt rejects an unknown pass and lists the known ones"
else
    echo "not ok $n - opt rejects an unknown pass and lists the known ones (exit $rc)"
    sed 's/^/# /' "$TMP/unknown.err"
    failed=$((failed + 1))
fi
[ $failed -eq 0 ]
