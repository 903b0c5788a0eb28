#!/bin/sh
# What the Fashion-MNIST example lets a user see (issue 11), as TAP: with --keep-last the
# partial last batch recompiles the step and LOOM_DEBUG=1 says why, naming the input and its
# source line; LOOM_PROFILE=1 lists the kernels by time with their source lines; LOOM_DUMP
# writes a plan that opens with the planned peak and what is alive there. And failures that
# say why: a label past the classes, --save into a missing folder (before training), a
# non-finite weight in --init.
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
check "... the slowest a matmul of the model, with its module scope and source line" \
    grep -qE "^ +1 .* rooted +[0-9a-f]+:[0-9]+ +matmul f32\[[0-9,]+\] +fc[123](\.grad)? \(fashion_models.h:[0-9]+\)$" "$TMP/err"

mkdir "$TMP/dump"
check "LOOM_DUMP writes the step's files" \
    exit_is 0 env LOOM_DUMP="$TMP/dump" "$EX" --model mlp --limit-steps 2
plan=$(ls "$TMP"/dump/step*.plan.txt | head -n 1)
check "the plan opens with the planned peak" grep -q "^memory: planned peak [0-9]* bytes" "$plan"
check "... and lists what is alive there with source lines" grep -q "fashion_models.h:[0-9]*" "$plan"

# ---- failures that say why ---------------------------------------------------------------
# IDX files of 4 images whose labels hold a 12: once they trained to a NaN loss blamed on --lr.
mkdir "$TMP/idx"
/usr/bin/env python3 - "$TMP/idx" <<'END'
import gzip, struct, sys
d = sys.argv[1]
for split in ("train", "t10k"):
    with gzip.open(f"{d}/{split}-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">iiii", 0x803, 4, 28, 28) + bytes(range(256)) * 12 + bytes(64))
    with gzip.open(f"{d}/{split}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">ii", 0x801, 4) + bytes([1, 12, 3, 4]))
END
check "labels past the 10 classes are an error" \
    exit_is 1 "$EX" --model mlp --limit-steps 1 --batch-size 2 --data-dir "$TMP/idx"
check "... naming the label, the image and the file" \
    grep -q "train-labels-idx1-ubyte.gz: label 12 of image 1 is not one of the 10 classes (0..9)" \
    "$TMP/err"
check "--save into a missing folder fails" \
    exit_is 1 "$EX" --model mlp --limit-steps 200 --save "$TMP/nope/w.safetensors"
check "... before training, naming why" sh -c \
    'grep -q -- "--save .*/nope/w.safetensors: its folder does not exist" "$1" && ! grep -q "^epoch" "$1"' \
    sh "$TMP/err"
check "a checkpoint to resume from" \
    exit_is 0 "$EX" --model mlp --limit-steps 1 --save "$TMP/w.safetensors"
# the first float of the first tensor becomes NaN
/usr/bin/env python3 - "$TMP/w.safetensors" "$TMP/nan.safetensors" <<'END'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
hdr = json.loads(b[8:8 + n])
_, t = next((k, v) for k, v in sorted(hdr.items()) if k != "__metadata__" and v["dtype"] == "F32")
at = 8 + n + t["data_offsets"][0]
b[at:at + 4] = struct.pack("<f", float("nan"))
open(sys.argv[2], "wb").write(b)
END
check "--init with a NaN weight fails" \
    exit_is 1 "$EX" --model mlp --limit-steps 1 --init "$TMP/nan.safetensors"
check "... naming the tensor and the element, not the learning rate" sh -c \
    'grep -q -- "--init .*nan.safetensors: .* holds nan at element 0: the checkpoint is damaged" "$1" && ! grep -q "smaller --lr" "$1"' \
    sh "$TMP/err"

tap_finish
