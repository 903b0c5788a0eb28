#!/bin/sh
# The ResNet example end to end, as TAP, on tiny images (ResNet-18 at 32x32, 10 classes,
# batch 4: the large shapes are benchmarks, bench/run_train_bench.sh --resnet): usage errors
# exit 2 with a clear message, the --json line's fields, --save then --init restoring the
# model, optimizer and scaler state, --data files (used in file order with --no-shuffle).
# Usage: test_resnet_example.sh /path/to/resnet
set -u

if [ $# -ne 1 ] && [ $# -ne 3 ]; then
    echo "usage: $0 /path/to/resnet [/path/to/mpiexec HAVE_MPI]" >&2
    exit 2
fi
EX=$1
MPIEXEC=${2:-}
HAVE_MPI=${3:-0}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/loom-resnet-test.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM
echo "1..10"

n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() {
    n=$((n + 1))
    echo "not ok $n - $1"
    for f in "$2" "${3:-}"; do
        [ -n "$f" ] && [ -f "$f" ] && sed 's/^/# /' "$f"
    done
}
# field FILE NAME: a value from the example's JSON line
field() { sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" "$1" | tail -n 1; }
# losses FILE: the step=<n> loss=<value> lines
losses() { grep '^step=' "$1"; }

# usage ARGS... -- PATTERN: the example exits 2 and stderr matches PATTERN
usage_case() {
    pattern=$1
    shift
    "$EX" "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ $rc -eq 2 ] && grep -q -- "$pattern" "$TMP/err" && grep -q "Try 'resnet --help'" "$TMP/err"; then
        return 0
    fi
    echo "# $* exited $rc" >>"$TMP/err"
    return 1
}
if usage_case "arch must be resnet18 or resnet50, not 'vgg'" --arch vgg &&
    usage_case "optimizer must be sgd, adam or adamw" --optimizer lamb &&
    usage_case "lr-schedule must be constant, step or cosine" --lr-schedule poly &&
    usage_case "image-size needs an integer >= 1" --image-size 0 &&
    usage_case "unknown option '--bogus'" --bogus &&
    usage_case "--lr needs a value" --lr &&
    usage_case "momentum applies to --optimizer sgd only" --optimizer adamw --momentum 0.5; then
    ok "usage errors exit 2 naming the problem"
else
    not_ok "usage errors exit 2 naming the problem" "$TMP/err"
fi
"$EX" --help >"$TMP/help" 2>&1
if [ $? -eq 0 ] && grep -q -- "--arch resnet18|resnet50" "$TMP/help" && grep -q -- "--data FILE" "$TMP/help"; then
    ok "--help describes the options and exits 0"
else
    not_ok "--help" "$TMP/help"
fi

tiny="--arch resnet18 --image-size 32 --num-classes 10 --batch-size 4 --train-images 16"

# Synthetic data, SGD, the JSON line and the log lines.
"$EX" $tiny --max-steps 3 --log-interval 1 --log-every 1 --json --save "$TMP/ck.safetensors" \
    >"$TMP/a" 2>"$TMP/a.err"
rc=$?
fields_ok=1
for k in arch optimizer amp batch_size image_size steps final_loss top1 top5 samples_per_sec \
    samples_per_sec_median compile_time_ms first_step_ms planned_peak_bytes \
    peak_device_memory_bytes world_size; do
    [ -n "$(field "$TMP/a" $k)" ] || { fields_ok=0; echo "# no field $k" >>"$TMP/a.err"; }
done
if [ $rc -eq 0 ] && [ $fields_ok -eq 1 ] && [ "$(field "$TMP/a" arch)" = '"resnet18"' ] &&
    [ "$(field "$TMP/a" steps)" = 3 ] && [ "$(field "$TMP/a" eval_images)" = 4 ] &&
    [ "$(losses "$TMP/a" | wc -l)" -eq 3 ] &&
    awk -v p="$(field "$TMP/a" planned_peak_bytes)" -v m="$(field "$TMP/a" peak_device_memory_bytes)" \
        'BEGIN { exit !(p > 0 && m >= p) }'; then
    ok "the --json line has the run's fields (planned peak $(field "$TMP/a" planned_peak_bytes) bytes)"
else
    not_ok "the --json line (exit $rc)" "$TMP/a" "$TMP/a.err"
fi
if grep -q "^memory: planned peak [0-9]* bytes" "$TMP/a.err" &&
    grep -q "^epoch 1 step 2/3 batch_size 4 loss [0-9.]* batch_time [0-9.]*s samples/s [0-9.]* peak_mem [0-9.]* MB" "$TMP/a.err"; then
    ok "the planned peak and the log lines (epoch, step, batch, loss, time, samples/s, memory)"
else
    not_ok "the planned peak and the log lines" "$TMP/a.err"
fi

# The checkpoint: torchvision's names, and optimizer and scaler state beside them.
if grep -q '"layer4.1.bn2.num_batches_tracked":{"dtype":"I64","shape":\[\]' "$TMP/ck.safetensors" &&
    grep -q '"layer2.0.downsample.0.weight":{"dtype":"F32","shape":\[128,64,1,1\]' "$TMP/ck.safetensors" &&
    grep -q '"optimizer.state.61.momentum_buffer"' "$TMP/ck.safetensors" &&
    grep -q '"optimizer.step"' "$TMP/ck.safetensors"; then
    ok "--save writes torchvision's state_dict names and the optimizer's state"
else
    not_ok "--save's names" "$TMP/a.err"
fi

# --save then --init: with one batch of data (4 images, file order) every step sees the same
# images, so 3 steps, saved, then 2 more from the checkpoint must log the losses of steps 3
# and 4 of one uninterrupted run: the momentum buffers and the optimizer's step counter come
# back (a fresh optimizer's first step differs). bf16 with a dynamic scaler, whose state is
# saved too; f16's dynamic scale (every step overflows at first, halving it) must end where
# the uninterrupted run's does.
common="$tiny --train-images 4 --no-shuffle --log-every 1 --json --eval-images 0 --lr 0.01 --loss-scale dynamic"
"$EX" $common --amp bf16 --epochs 5 >"$TMP/five" 2>"$TMP/five.err" &&
    "$EX" $common --amp bf16 --epochs 3 --save "$TMP/three.safetensors" >"$TMP/three" 2>"$TMP/three.err" &&
    "$EX" $common --amp bf16 --epochs 2 --init "$TMP/three.safetensors" >"$TMP/two" 2>"$TMP/two.err" &&
    "$EX" $common --amp bf16 --epochs 2 --init "$TMP/three.safetensors" --optimizer adamw >"$TMP/other" 2>"$TMP/other.err" &&
    "$EX" $common --amp f16 --epochs 5 >"$TMP/f16five" 2>"$TMP/f16five.err" &&
    "$EX" $common --amp f16 --epochs 3 --save "$TMP/f16three.safetensors" >/dev/null 2>"$TMP/f16three.err" &&
    "$EX" $common --amp f16 --epochs 2 --init "$TMP/f16three.safetensors" >"$TMP/f16two" 2>"$TMP/f16two.err"
rc=$?
expect=$(losses "$TMP/five" | sed -n '4,5p' | sed 's/.*loss=//' | tr '\n' ' ')
got=$(losses "$TMP/two" | sed 's/.*loss=//' | tr '\n' ' ')
first=$(losses "$TMP/five" | sed -n '1p' | sed 's/.*loss=//')
if [ $rc -eq 0 ] && grep -q '"scaler.scale"' "$TMP/three.safetensors" && [ -n "$got" ] &&
    [ "$got" = "$expect" ] && [ "$got" != "$first $first " ] && ! grep -q "ignoring" "$TMP/two.err" &&
    grep -q "ignoring its optimizer state (another optimizer)" "$TMP/other.err"; then
    ok "--init resumes exactly (losses $got), another optimizer ignores the saved state"
else
    not_ok "--save then --init resumes exactly: steps 3-4 '$expect', resumed '$got' (exit $rc)" \
        "$TMP/two.err" "$TMP/other.err"
fi
s5=$(field "$TMP/f16five" loss_scale)
s2=$(field "$TMP/f16two" loss_scale)
if [ $rc -eq 0 ] && [ -n "$s5" ] && [ "$s5" = "$s2" ] && [ "$s5" != 65536 ]; then
    ok "--init restores f16's dynamic loss scale (both runs end at $s5)"
else
    not_ok "--init restores the loss scale: uninterrupted $s5, resumed $s2" "$TMP/f16two.err"
fi

# --data: a file of 8 images; the second run loads the first's checkpoint and, with lr 0,
# sees the same first loss on the same first batch.
/usr/bin/env python3 - "$TMP/data.safetensors" <<'EOF' 2>"$TMP/py.err" || printf 'PYFAIL' >"$TMP/data.safetensors"
import json, struct, sys, random
random.seed(1)
n, c, h, w = 8, 3, 32, 32
imgs = struct.pack("<%df" % (n * c * h * w), *[random.uniform(-1.5, 1.5) for _ in range(n * c * h * w)])
labels = struct.pack("<%dq" % n, *[random.randrange(10) for _ in range(n)])
hdr = {"images": {"dtype": "F32", "shape": [n, c, h, w], "data_offsets": [0, len(imgs)]},
       "labels": {"dtype": "I64", "shape": [n], "data_offsets": [len(imgs), len(imgs) + len(labels)]}}
hb = json.dumps(hdr).encode()
hb += b" " * (-len(hb) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(hb)) + hb + imgs + labels)
EOF
d="--arch resnet18 --num-classes 10 --batch-size 4 --no-shuffle --log-every 1 --json --data $TMP/data.safetensors"
"$EX" $d --max-steps 2 --save "$TMP/d.safetensors" >"$TMP/d1" 2>"$TMP/d1.err" &&
    "$EX" $d --max-steps 1 --lr 0 --init "$TMP/d.safetensors" --image-size 999 >"$TMP/d2" 2>"$TMP/d2.err" &&
    "$EX" $d --max-steps 1 --lr 0 --init "$TMP/d.safetensors" >"$TMP/d3" 2>"$TMP/d3.err"
rc=$?
if [ $rc -eq 0 ] && [ "$(field "$TMP/d1" image_size)" = 32 ] && [ "$(field "$TMP/d2" image_size)" = 32 ] &&
    [ "$(field "$TMP/d1" eval_images)" = 4 ] && [ "$(losses "$TMP/d2")" = "$(losses "$TMP/d3")" ] &&
    [ "$(losses "$TMP/d1" | head -n 1)" != "$(losses "$TMP/d2" | head -n 1)" ]; then
    ok "--data trains on the file's images (their size, not --image-size) in file order"
else
    not_ok "--data (exit $rc)" "$TMP/d1.err" "$TMP/d2.err"
fi
printf 'not a safetensors file' >"$TMP/bad.safetensors"
"$EX" --arch resnet18 --data "$TMP/bad.safetensors" >"$TMP/out" 2>"$TMP/err"
rc=$?
if [ $rc -eq 1 ] && grep -q "resnet: --data: .*bad.safetensors" "$TMP/err"; then
    ok "an unreadable --data file is a runtime error naming it"
else
    not_ok "an unreadable --data file (exit $rc)" "$TMP/err"
fi

# Two ranks: each takes 4 of the global batch of 8; rank 0 alone prints one JSON line. A
# global batch the ranks cannot split is a usage error reported once.
if [ -z "$MPIEXEC" ] || [ "$HAVE_MPI" != 1 ]; then
    ok "# SKIP no mpiexec or Loom built without MPI"
else
    timeout 300 "$MPIEXEC" -n 2 "$EX" $tiny --batch-size 8 --max-steps 2 --json >"$TMP/mpi" 2>"$TMP/mpi.err" &&
        timeout 120 "$MPIEXEC" -n 2 "$EX" $tiny --batch-size 7 >"$TMP/mpi7" 2>"$TMP/mpi7.err"
    rc=$?
    if [ $rc -eq 2 ] && [ "$(grep -c '^{' "$TMP/mpi")" -eq 1 ] &&
        [ "$(field "$TMP/mpi" world_size)" = 2 ] && [ "$(field "$TMP/mpi" steps)" = 2 ] &&
        [ "$(grep -c "batch-size 7 is the global batch" "$TMP/mpi7.err")" -eq 1 ]; then
        ok "mpiexec -n 2 splits the global batch over two ranks; rank 0 reports"
    else
        not_ok "mpiexec -n 2 (exit $rc)" "$TMP/mpi.err" "$TMP/mpi7.err"
    fi
fi
