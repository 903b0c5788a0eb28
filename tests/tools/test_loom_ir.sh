#!/bin/sh
# Tests of the loom-ir CLI over the sample graphs in tests/data, as TAP; and that the graphs
# bench/README.md times (bench/graphs) still parse and verify.
# Usage: test_loom_ir.sh /path/to/loom-ir /path/to/tests/data [/path/to/bench/graphs]
set -u

if [ $# -ne 2 ] && [ $# -ne 3 ]; then
    echo "usage: $0 /path/to/loom-ir /path/to/tests/data [/path/to/bench/graphs]" >&2
    exit 2
fi
LOOM_IR=$1
DATA=$2
BENCH_GRAPHS=${3:-}
. "$(dirname "$0")/tap_lib.sh"

# ---- print round trips -----------------------------------------------------------------
for f in "$DATA"/*.loom; do
    name=$(basename "$f")
    case $name in bad_*) continue ;; esac
    "$LOOM_IR" print "$f" >"$TMP/$name.p1" 2>"$TMP/$name.err"
    check "print $name exits 0" [ $? -eq 0 ]
    "$LOOM_IR" print - <"$TMP/$name.p1" >"$TMP/$name.p2" 2>&1
    check "print $name | print - reproduces it byte for byte" \
        same_file "$TMP/$name.p1" "$TMP/$name.p2"
    "$LOOM_IR" hash "$f" >"$TMP/$name.h1"
    "$LOOM_IR" hash - <"$TMP/$name.p1" >"$TMP/$name.h2"
    check "hash of $name equals the hash of its printed form" \
        same_file "$TMP/$name.h1" "$TMP/$name.h2"
    check "hash of $name is 16 hex digits" grep -qx '[0-9a-f]\{16\}' "$TMP/$name.h1"
done
for f in ${BENCH_GRAPHS:+"$BENCH_GRAPHS"/*.loom}; do
    check "bench graph $(basename "$f") verifies" exit_is 0 "$LOOM_IR" verify "$f"
done
check "canonical.loom prints as itself" same_file "$TMP/canonical.loom.p1" "$DATA/canonical.loom"
check "canonical.loom is the printed form of sgd_step.loom" \
    same_file "$TMP/sgd_step.loom.p1" "$DATA/canonical.loom"
check "mlp.loom and canonical.loom hash differently" \
    differ "$TMP/mlp.loom.h1" "$TMP/canonical.loom.h1"

# ---- verify ------------------------------------------------------------------------------
check "verify accepts mlp.loom" exit_is 0 "$LOOM_IR" verify "$DATA/mlp.loom"
check "verify reports the node count" \
    has_line "$TMP/out" "$DATA/mlp.loom: ok: 13 nodes, 5 inputs, 2 outputs"
check "verify rejects an undefined value with exit 1" \
    exit_is 1 "$LOOM_IR" verify "$DATA/bad_undefined.loom"
check "the parse error names file:line:col" \
    has_line "$TMP/err" "$DATA/bad_undefined.loom:3:16: error: undefined value '%2'"
check "verify reads stdin as <stdin>" exit_is 1 "$LOOM_IR" verify - <"$DATA/bad_undefined.loom"
check "stdin errors name <stdin>:line:col" \
    has_line "$TMP/err" "<stdin>:3:16: error: undefined value '%2'"
check "verify rejects a bad alias with exit 1" exit_is 1 "$LOOM_IR" verify "$DATA/bad_alias.loom"
check "verifier errors name the file and node" has_line "$TMP/err" \
    "$DATA/bad_alias.loom: error: %1: output of type f32[3] cannot be written into f32[2,3]"
check "a missing file exits 1" exit_is 1 "$LOOM_IR" print "$TMP/does-not-exist.loom"
check "a missing file is reported as FILE: error:" \
    has_line "$TMP/err" "$TMP/does-not-exist.loom: error: cannot open: No such file or directory"
check "print rejects bad input with exit 1" exit_is 1 "$LOOM_IR" print "$DATA/bad_undefined.loom"
check "print writes nothing on stdout for bad input" [ ! -s "$TMP/out" ]

# ---- stats (numbers worked out by hand for mlp.loom) -------------------------------------
check "stats exits 0" exit_is 0 "$LOOM_IR" stats "$DATA/mlp.loom"
check "stats prints the node count" has_line "$TMP/out" "nodes: 13"
check "stats counts matmuls" has_line "$TMP/out" "  matmul             2"
check "stats counts inputs" has_line "$TMP/out" "  input              5"
check "stats lists input 1 with its type and size" \
    has_line "$TMP/out" "  input 1: %1 f32[8,16] (512 bytes)"
check "stats lists output 1 with its type and size" \
    has_line "$TMP/out" "  output 1: %8 f32[4,16] (256 bytes)"
check "stats sums input bytes" has_line "$TMP/out" "input bytes: 864"
check "stats sums output bytes" has_line "$TMP/out" "output bytes: 260"
# matmuls 2*4*16*8 + 2*4*2*16, add/relu 64 each, sub/mul 8 each, reduce_mean 8
check "stats estimates FLOPs" has_line "$TMP/out" "flops: 1432"
check "stats shows aliases" exit_is 0 "$LOOM_IR" stats "$DATA/canonical.loom"
check "stats names the input an output is written into" \
    has_line "$TMP/out" "  output 0: %8 f32[3,4] (48 bytes), written into input 0"

# ---- dot ---------------------------------------------------------------------------------
check "dot exits 0" exit_is 0 "$LOOM_IR" dot "$DATA/mlp.loom"
check "dot output starts with digraph" first_line_is "$TMP/out" "digraph loom {"
check "dot draws the add's operands" has_line "$TMP/out" '  n5 -> n7 [label="0"];'
check "dot draws outputs" has_line "$TMP/out" '  n12 -> out0;'
check "dot has one box per node" count_is "$TMP/out" '^  n[0-9]* \[label=' 13
if command -v dot >/dev/null 2>&1; then
    cp "$TMP/out" "$TMP/mlp.dot"
    check "Graphviz's dot renders it" exit_is 0 dot -Tsvg -o "$TMP/mlp.svg" "$TMP/mlp.dot"
    check "... with a box per node and output" count_is "$TMP/mlp.svg" 'class="node"' 15
else
    echo "# Graphviz's dot is not installed (scripts/setup.sh installs it): DOT not rendered"
fi

# ---- plan: the memory report first; --svg draws it ------------------------------------------
check "plan exits 0" exit_is 0 "$LOOM_IR" plan "$DATA/mlp.loom"
check "plan opens with the planned peak" \
    has_line "$TMP/out" "memory: planned peak 324 bytes (0.00 MiB) = arena 64 + outputs 260"
check "plan lists the largest live value first, with its line" \
    has_line "$TMP/out" "             256  %8 relu f32[4,16] (output 1) mlp.c:41"
check "plan --svg exits 0" exit_is 0 "$LOOM_IR" plan --svg "$DATA/mlp.loom"
check "plan --svg writes an SVG" first_line_is "$TMP/out" \
    '<svg xmlns="http://www.w3.org/2000/svg" width="960" height="420" font-family="sans-serif" font-size="12">'
check "plan --svg marks the peak" grep -q '>peak: kernel 1 (matmul mlp.c:42) 292 bytes</text>' "$TMP/out"
check "plan --svg draws a step per kernel" grep -q '<polyline fill="#cde"' "$TMP/out"

# ---- compile and run: the step's pipeline ---------------------------------------------------
check "run --check exits 0" exit_is 0 "$LOOM_IR" run --check --repeat=3 "$DATA/mlp.loom"
check "run --check compares every output with the interpreter" \
    count_is "$TMP/out" '^check: run 1: output [01] f32.*: matches the interpreter' 2
check "run prints the median time and the kernels by time" grep -q '^run: 3 runs on .*median' "$TMP/out"
check "run names each kernel's source line" grep -q ' matmul f32\[4,16\] *mlp.c:40$' "$TMP/out"
check "run --check checks every run" has_line "$TMP/out" "check: 3 of 3 runs match the interpreter"
check "run --check feeds each run the donated outputs of the one before" \
    exit_is 0 "$LOOM_IR" run --check --repeat=4 "$DATA/sgd_step.loom"
check "run --check says the runs were chained" has_line "$TMP/out" \
    "check: 4 of 4 runs match the interpreter (each run from the donated outputs of the one before)"
check "run --check names the input a donated output is written into" grep -q \
    '^check: run 1: output 0 f32\[3,4\], written into input 0: matches' "$TMP/out"
# A result outside a matmul's epilogue reading the input the epilogue is donated into: on
# several threads this raced until the planner copied such outputs (inplace_side_race.loom).
check "an in-place epilogue beside a loop that reads its input matches over 20 runs" \
    env LOOM_NUM_THREADS=4 "$LOOM_IR" run --check --repeat=20 "$DATA/inplace_side_race.loom"
# An in-place update beside a product of its result and the old value: the update's result
# and the input it is written into are one buffer, so the kernel takes one pointer for both
# (without noalias, which would tell LLVM they never overlap): 3 buffers loaded, not 4.
cat > "$TMP/inplace.loom" <<'EOF'
loom.graph {
  %p = input {index = 0} : f32[64]
  %q = input {index = 1} : f32[64]
  %c = constant {value = 1} : f32[]
  %cb = broadcast %c : f32[64]
  %x = add %q, %cb : f32[64]
  %r = mul %x, %p : f32[64]
  return %x {alias = 0}, %r
}
EOF
check "an in-place update compiles" exit_is 0 "$LOOM_IR" compile --emit=llvm "$TMP/inplace.loom"
awk '/^define void @loom_k0\(/,/^}/' "$TMP/out" > "$TMP/k0.ll"
check "an in-place pair of buffers is one pointer" count_is "$TMP/k0.ll" 'load ptr' 3
check "an in-place update matches the interpreter run after run" \
    exit_is 0 "$LOOM_IR" run --check --repeat=3 "$TMP/inplace.loom"
# 1024 random terms: outputs near zero keep the rounding of terms of the output's scale
cat > "$TMP/dot.loom" <<'EOF'
loom.graph {
  %a = input {index = 0} : f32[64,1024]
  %b = input {index = 1} : f32[1024,256]
  %c = matmul %a, %b : f32[64,256]
  return %c
}
EOF
check "run --check holds values that cancel to the output's scale" \
    exit_is 0 "$LOOM_IR" run --check --repeat=1 "$TMP/dot.loom"
check "run --check names the output's RMS in its tolerance" grep -q \
    '^check: run 1: output 0 f32\[64,256\]: matches the interpreter (largest difference .* of the tolerance, 0.0001 x (|value| + 1[01].*, the output.s RMS))$' "$TMP/out"
check "compile --emit=llvm exits 0" exit_is 0 "$LOOM_IR" compile --emit=llvm "$DATA/mlp.loom"
check "compile --emit=llvm names each module" first_line_is "$TMP/out" "; ---- x.m0.ll"
if command -v opt-19 >/dev/null 2>&1; then
    cp "$TMP/out" "$TMP/mlp.ll"
    check "compile --emit=llvm is LLVM IR that opt accepts" \
        exit_is 0 opt-19 -passes=verify -disable-output "$TMP/mlp.ll"
fi
check "compile (asm by default) exits 0" exit_is 0 "$LOOM_IR" compile "$DATA/mlp.loom"
check "compile prints each kernel's entry" count_is "$TMP/out" '^loom_k[0-9]*:' 3
check "compile --emit=plan opens with the plan" exit_is 0 "$LOOM_IR" compile --emit=plan "$DATA/mlp.loom"
check "compile --emit=plan's first line" first_line_is "$TMP/out" \
    "plan: 3 kernels, 0 copies, arena 64 bytes, peak 324 bytes"
check "an unknown --emit exits 2" exit_is 2 "$LOOM_IR" compile --emit=bogus "$DATA/mlp.loom"
check "--repeat=0 exits 2" exit_is 2 "$LOOM_IR" run --repeat=0 "$DATA/mlp.loom"

# ---- usage -------------------------------------------------------------------------------
check "--help exits 0" exit_is 0 "$LOOM_IR" --help
check "--help prints usage on stdout" grep -q '^usage: loom-ir' "$TMP/out"
check "no arguments exit 2" exit_is 2 "$LOOM_IR"
check "no arguments print a usage line on stderr" grep -q '^usage: loom-ir' "$TMP/err"
check "an unknown command exits 2" exit_is 2 "$LOOM_IR" frobnicate "$DATA/mlp.loom"
check "an unknown command is named" grep -q "unknown command 'frobnicate'" "$TMP/err"
check "a missing FILE exits 2" exit_is 2 "$LOOM_IR" print

tap_finish
