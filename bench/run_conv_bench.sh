#!/bin/sh
# Convolution kernels, Loom vs PyTorch 1.13 (oneDNN) on CPU, side by side: runs
# build/bench/bench_conv and bench/torch_conv.py on ResNet-50's convolution shapes with the
# same batch, threads and dtype, one layer at a time and the two sides in turns (so a change
# in the machine's load hits both alike), then prints one table (bench/README.md).
set -eu

usage() {
    cat <<'USAGE'
Usage: bench/run_conv_bench.sh [--build DIR] [--batch N] [--image-size N] [--dtype LIST] [--threads N]
                               [--reps N] [--warmup N] [--layer LIST] [--pass LIST]
                               [--best] [--markdown]
  --build DIR     Meson build folder holding bench/bench_conv (default: build)
  --batch N       images per batch (default 8)
  --image-size N  the network's input images are N x N (default 224); each layer runs at its
                  stage's extent (64: 64, 16, 8, 4, 2)
  --dtype LIST    comma-separated among f32,bf16 (default f32,bf16)
  --threads N     threads on both sides (default 2)
  --reps N        timed runs per pass (default 10), after --warmup N untimed ones (default 3)
  --layer LIST    comma-separated layer names (default all; bench_conv --list names them)
  --pass LIST     comma-separated among forward,grad_input,grad_weight (default all)
  --best          the fastest run of each pass instead of the median
  --markdown      print the table as Markdown
USAGE
}

here=$(cd "$(dirname "$0")" && pwd)
build="$here/../build"
batch=8
image_size=224
dtypes="f32,bf16"
threads=2
layers=""
common=""
markdown=0
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --image-size) image_size=$2; shift 2 ;;
    --dtype) dtypes=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --layer) layers=$2; shift 2 ;;
    --reps|--warmup|--pass) common="$common $1 $2"; shift 2 ;;
    --best) common="$common --best"; shift ;;
    --markdown) markdown=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_conv_bench.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
done

bench="$build/bench/bench_conv"
if [ ! -x "$bench" ]; then
    echo "run_conv_bench.sh: $bench not found: build it first (ninja -C $build bench/bench_conv)" >&2
    exit 1
fi
[ -n "$layers" ] || layers=$("$bench" --list | tr '\n' ',')

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$tmp/loom.jsonl"
: >"$tmp/torch.jsonl"

for dtype in $(echo "$dtypes" | tr ',' ' '); do
    for layer in $(echo "$layers" | tr ',' ' '); do
        args="--batch $batch --image-size $image_size --threads $threads --dtype $dtype --layer $layer$common"
        echo "Loom: $bench $args" >&2
        # shellcheck disable=SC2086
        LOOM_NUM_THREADS=$threads "$bench" --json $args >>"$tmp/loom.jsonl"
        echo "PyTorch: /usr/bin/python3 $here/torch_conv.py $args" >&2
        # shellcheck disable=SC2086
        OMP_NUM_THREADS=$threads /usr/bin/python3 "$here/torch_conv.py" --json $args \
            >>"$tmp/torch.jsonl"
    done
done

cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
/usr/bin/python3 -B "$here/bench_table.py" conv "$tmp/loom.jsonl" "$tmp/torch.jsonl" "$markdown" \
    "${cpu:-unknown}"
