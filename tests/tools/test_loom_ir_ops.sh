#!/bin/sh
# Tests of `loom-ir ops`: one row per op of ops.def (read here from the source, so a new op
# is checked without editing this script), each layer's verdict as the layers give it, the
# JSON form, --op and --check, as TAP.
# Usage: test_loom_ir_ops.sh /path/to/loom-ir /path/to/ir/ops.def
set -u

if [ $# -ne 2 ]; then
    echo "usage: $0 /path/to/loom-ir /path/to/ir/ops.def" >&2
    exit 2
fi
LOOM_IR=$1
OPS_DEF=$2
. "$(dirname "$0")/tap_lib.sh"
PY=/usr/bin/python3

ops=$(sed -n 's/^LOOM_OP([A-Z_0-9]*, *\([a-z_0-9]*\),.*/\1/p' "$OPS_DEF")
n_ops=$(echo "$ops" | wc -w)
check "ops.def has ops" [ "$n_ops" -ge 40 ]
check "ops exits 0" exit_is 0 "$LOOM_IR" ops
cp "$TMP/out" "$TMP/table"
check "ops writes nothing on stderr" is_empty "$TMP/err"
for op in $ops; do
    check "ops lists $op" grep -q "^$op " "$TMP/table"
done
# a row's cells: op kind autocast takes interpreter JIT VJP ...
row() { grep "^$1 " "$TMP/table" | tr -s ' '; }
check "matmul: contraction, autocast lower, numeric, all layers, a VJP" \
    [ "$(row matmul | cut -d' ' -f1-7)" = "matmul contraction lower numeric all all yes" ]
check "exp: fp32 class, floats only" [ "$(row exp | cut -d' ' -f1-7)" = "exp unary fp32 float all all yes" ]
check "eq: bool result, nothing to differentiate" [ "$(row eq | cut -d' ' -f7)" = "-" ]
check "rand_uniform: no float operand, nothing to differentiate" \
    [ "$(row rand_uniform | cut -d' ' -f7)" = "-" ]
check "all_gather has no VJP, with autograd's message as a note" \
    [ "$(row all_gather | cut -d' ' -f7)" = "no" ]
check "... the note" grep -q "^  \[[0-9]*\] backward: all_gather of f32\[.*\] has no gradient rule" "$TMP/table"
check "all_reduce: only some samples (sum) have one" [ "$(row all_reduce | cut -d' ' -f7)" = "some" ]
check "... the note says only sum has" grep -q "(only sum has)" "$TMP/table"
if grep -q avx512_bf16 /proc/cpuinfo 2>/dev/null && grep -q avx512f /proc/cpuinfo; then
    # the bf16 path is chosen by vdpbf16ps's measured FLOP/s against the f32 FMA's
    gain=$(sed -n 's/^  bf16: .*(vdpbf16ps measured at \([0-9.]*\)x the f32 FMA.s FLOP\/s: .*)$/\1/p' "$TMP/table")
    echo "# this AVX512-BF16 CPU: vdpbf16ps measured at ${gain:-?}x the f32 FMA's FLOP/s"
    check "the bf16 line gives the measured gain" [ -n "$gain" ]
    check "... a plausible one (0.2x-4x)" awk -v g="${gain:-0}" 'BEGIN { exit !(g > 0.2 && g < 4) }'
    if awk -v g="${gain:-0}" 'BEGIN { exit !(g >= 1.5) }'; then
        check "bf16 matmuls use vdpbf16ps where it gains 1.5x or more" \
            grep -q "^  bf16: avx512bf16: .*: taken)$" "$TMP/table"
    else
        check "bf16 matmuls take the f32 path where vdpbf16ps gains less than 1.5x" \
            grep -q "^  bf16: f32: .*: below 1.5x, not taken)$" "$TMP/table"
    fi
    check "LOOM_MATMUL_ISA=avx512bf16 forces vdpbf16ps" \
        sh -c 'LOOM_MATMUL_ISA=avx512bf16 "$1" ops --op matmul | grep -q "^  bf16: avx512bf16: .*(LOOM_MATMUL_ISA=avx512bf16)$"' sh "$LOOM_IR"
else
    echo "# this CPU has no AVX512-BF16: its bf16 matmuls take the f32 path"
    check "bf16 matmuls take the f32 path on this CPU" grep -q "^  bf16: f32: " "$TMP/table"
fi
check "LOOM_MATMUL_ISA=f32 forces the f32 path" \
    sh -c 'LOOM_MATMUL_ISA=f32 "$1" ops --op matmul | grep -q "^  bf16: f32: "' sh "$LOOM_IR"
check "f16 matmuls convert to f32" grep -q "^  f16:  f32: " "$TMP/table"
check "LOOM_MATMUL_ISA=avx2 names the AVX2 C tiles" \
    sh -c 'LOOM_MATMUL_ISA=avx2 "$1" ops --op matmul | grep -q "^  f16:  f32: .*, 6 x 16 C tiles (AVX2)$"' sh "$LOOM_IR"
check "LOOM_MATMUL_ISA=avx512 names the AVX-512 C tiles" \
    sh -c 'LOOM_MATMUL_ISA=avx512 "$1" ops --op matmul | grep -q "^  f16:  f32: .*, 8 x 32 or 16 x 16 C tiles (AVX-512)$"' sh "$LOOM_IR"
check "the AMX line says why it does not run" grep -qE "^  amx-bf16: (this CPU has no AMX-BF16|the AMX-BF16 kernel is not implemented yet)$" "$TMP/table"

check "ops --op matmul exits 0" exit_is 0 "$LOOM_IR" ops --op matmul
check "... with one row" [ "$(grep -c "^[a-z_]* *[a-z]* *[a-z0-9]* *[a-z,0-9]* *all" "$TMP/out")" -eq 1 ]
check "... the same row as the full table" [ "$(grep "^matmul " "$TMP/out")" = "$(grep "^matmul " "$TMP/table")" ]
check "ops --op of an unknown op exits 2" exit_is 2 "$LOOM_IR" ops --op=frobnicate
check "... naming it" first_line_is "$TMP/err" "loom-ir: ops: no such op in ops.def: 'frobnicate'"
check "ops with an operand exits 2" exit_is 2 "$LOOM_IR" ops extra

check "ops --json exits 0" exit_is 0 "$LOOM_IR" ops --json
check "... is JSON with a row per op of ops.def" $PY -c '
import json, sys
d = json.load(open(sys.argv[1]))
ops = sys.argv[2].split()
assert [r["op"] for r in d["ops"]] == ops, [r["op"] for r in d["ops"]]
m = {r["op"]: r for r in d["ops"]}
assert m["matmul"]["jit"] == ["f32", "f64", "i32", "i64", "bf16", "f16"], m["matmul"]
assert m["matmul"]["vjp"] == "yes" and m["all_gather"]["vjp"] == "no"
assert "no gradient rule" in m["all_gather"]["notes"]["vjp"]
assert m["select"]["takes"] == ["f32", "f64", "i32", "i64", "bf16", "f16", "bool"]
assert d["jit_checked_by"] == "codegen"
' "$TMP/out" "$ops"

check "ops --check --op matmul compiles, runs and matches the interpreter" \
    exit_is 0 "$LOOM_IR" ops --check --op matmul
check "... reports progress on stderr" grep -q "checking matmul (1 of 1)" "$TMP/err"
check "... and says the JIT column was run" grep -q "JIT (run)" "$TMP/out"

tap_finish
