#!/bin/sh
# What the Fashion-MNIST example lets a user see (issue 11), as TAP: with --keep-last the
# partial last batch recompiles the step and LOOM_DEBUG=1 says why, naming the input and its
# source line; LOOM_PROFILE=1 lists the kernels by time with their source lines; LOOM_DUMP
# writes a plan that opens with the planned peak and what is alive there.
# Usage: test_fashion_mnist_inspect.sh /path/to/fashion_mnist
set -u

if [ $# -ne 1 ]; then
    echo "usage: $0 /path/to/fashion_mnist" >&2
    exit 2
fi
EX=$1
DATA=${LOOM_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
    echo "1..0 # SKIP no Fashion-MNIST in $DATA (Debian's dataset-fashion-mnist)"
    exit 0
fi
. "$(dirname "$0")/../tools/tap_lib.sh"

# one epoch of the MLP: 60000 images are 937 batches of 64 and a last one of 32
check "--keep-last trains an epoch" \
    exit_is 0 env LOOM_DEBUG=1 "$EX" --model mlp --epochs 1 --keep-last
cp "$TMP/out" "$TMP/keep.out"
cp "$TMP/err" "$TMP/keep.err"
check "... of 938 steps, the last partial" grep -q "^trained 938 steps" "$TMP/keep.out"
check "LOOM_DEBUG names the input whose shape changed, with its source line" \
    grep -q "^loom: warning: step 937 recompiled: %0 input 0 at fashion_models.h:[0-9]* has f32\[32,784\] (was f32\[64,784\])" "$TMP/keep.err"
check "... and counts the recompile in its summary" \
    grep -q "^loom: debug: .* 1 recompiles of a near graph" "$TMP/keep.err"
check "a run of full batches" \
    exit_is 0 env LOOM_DEBUG=1 "$EX" --model mlp --epochs 1 --limit-steps 5
check "... and nothing recompiles" sh -c '! grep -q "recompiled" "$1"' sh "$TMP/err"

check "LOOM_PROFILE=1 runs" exit_is 0 env LOOM_PROFILE=1 "$EX" --model mlp --limit-steps 20
check "... and prints the kernels by total time" \
    grep -q "^Loom kernel profile: [0-9]* kernels ran" "$TMP/err"
check "... the slowest a matmul of the model, with its source line" \
    grep -qE "^ +1 .* matmul +[0-9a-f]+:[0-9]+ +matmul f32\[[0-9,]+\] +fashion_models.h:[0-9]+$" "$TMP/err"

mkdir "$TMP/dump"
check "LOOM_DUMP writes the step's files" \
    exit_is 0 env LOOM_DUMP="$TMP/dump" "$EX" --model mlp --limit-steps 2
plan=$(ls "$TMP"/dump/step*.plan.txt | head -n 1)
check "the plan opens with the planned peak" grep -q "^memory: planned peak [0-9]* bytes" "$plan"
check "... and lists what is alive there with source lines" grep -q "fashion_models.h:[0-9]*" "$plan"

tap_finish
