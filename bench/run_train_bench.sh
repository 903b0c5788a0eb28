#!/bin/sh
# Training throughput, Loom vs PyTorch 1.13 eager on CPU, side by side: runs
# build/bench/bench_train and bench/torch_train.py --bench with the same thread count,
# batches and optimizer, then prints one table with the ratios (bench/README.md).
# --resnet: ResNet-50 instead (issue 12), build/examples/resnet against torchvision's at
# batch 32 on 64x64 and batch 8 on 224x224 images, fp32 and bf16.
set -eu

usage() {
    cat <<'EOF'
Usage: bench/run_train_bench.sh [--build DIR] [--threads N] [--runs N] [--steps N]
                                [--warmup N] [--interp-steps N] [--config LIST]
                                [--optimizer sgd|adam|adamw] [--best] [--markdown]
                                [--resnet] [--amp LIST]
  --build DIR       Meson build folder holding bench/bench_train (default: build)
  --threads N       threads on both sides (default LOOM_NUM_THREADS, else all cores)
  --markdown        print the table as Markdown
  --resnet          ResNet-50 (configs r50_b32_64, r50_b8_224, default both, and r50_b32_224,
                    issue 12's memory goal, when named) with SGD (lr
                    0.01, momentum 0.9, weight decay 1e-4) on both sides; Loom's side is
                    examples/resnet, its samples/s the median step after 2 warm-up steps,
                    over 1 + warmup + runs*steps steps (defaults 3, 3 and 5)
  --amp LIST        --resnet: comma-separated among none,bf16 (default none,bf16)
  --rounds N        --resnet: N rounds, each running every configuration on both sides,
                    Loom first in odd rounds and PyTorch first in even ones (default 1); the
                    table gives each round's samples/s and the ratio of the medians
The other options go to both sides (--interp-steps to Loom only).
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
build="$here/../build"
threads="${LOOM_NUM_THREADS:-$(nproc)}"
common=""
loom_only=""
markdown=0
resnet=0
amps="none,bf16"
configs=""
rounds=1
runs=3
steps=5
warmup=3
optimizer=sgd
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --runs|--steps|--warmup|--config|--optimizer)
        common="$common $1 $2"
        case "$1" in
        --runs) runs=$2 ;; --steps) steps=$2 ;; --warmup) warmup=$2 ;;
        --config) configs=$2 ;; --optimizer) optimizer=$2 ;;
        esac
        shift 2 ;;
    --resnet) resnet=1; shift ;;
    --amp) amps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --interp-steps) loom_only="$loom_only $1 $2"; shift 2 ;;
    --best) common="$common --best"; shift ;;
    --markdown) markdown=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_train_bench.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ResNet-50: the example against torchvision, one process per configuration and side (each
# peak its own), one after the other (never two heavy jobs at once); with --rounds, the sides
# take turns going first, so a slow minute of this VM falls on both.
if [ $resnet -eq 1 ]; then
    ex="$build/examples/resnet"
    if [ ! -x "$ex" ]; then
        echo "run_train_bench.sh: $ex not found: build it first (ninja -C $build)" >&2
        exit 1
    fi
    case "$rounds" in
    ''|*[!0-9]*|0) echo "run_train_bench.sh: --rounds takes a whole number >= 1" >&2; exit 2 ;;
    esac
    total=$((1 + warmup + runs * steps))
    hyper="--optimizer $optimizer --lr 0.01 --weight-decay 1e-4"
    run_loom() { # round cfg amp batch size
        args="--arch resnet50 --batch-size $4 --image-size $5 --amp $3 $hyper"
        args="$args --max-steps $total --eval-images 0 --json --log-interval 1000000"
        echo "round $1: Loom: LOOM_NUM_THREADS=$threads $ex $args" >&2
        # A private, empty compile cache: the first step really compiles.
        cache=$(mktemp -d "$tmp/cache.XXXXXX")
        # shellcheck disable=SC2086
        LOOM_NUM_THREADS=$threads LOOM_CACHE_DIR=$cache "$ex" $args >"$tmp/loom.out" \
            2>"$tmp/loom.err" || { cat "$tmp/loom.err" >&2; exit 1; }
        rm -rf "$cache"
        sed "s/^{/{\"config\":\"$2\",\"threads\":$threads,\"round\":$1,/" "$tmp/loom.out" \
            >>"$tmp/loom.jsonl"
    }
    run_torch() { # round cfg amp
        targs="--bench --config $2 --amp $3 --threads $threads --runs $runs --steps $steps"
        targs="$targs --warmup $warmup $hyper"
        echo "round $1: PyTorch: /usr/bin/python3 $here/torch_train.py $targs" >&2
        # shellcheck disable=SC2086
        OMP_NUM_THREADS=$threads /usr/bin/python3 "$here/torch_train.py" $targs >"$tmp/torch.out"
        sed "s/^{/{\"round\":$1,/" "$tmp/torch.out" >>"$tmp/torch.jsonl"
    }
    round=1
    while [ $round -le "$rounds" ]; do
        for amp in $(echo "$amps" | tr ',' ' '); do
            for cfg in $(echo "${configs:-r50_b32_64,r50_b8_224}" | tr ',' ' '); do
                case "$cfg" in
                r50_b32_64) batch=32 size=64 ;;
                r50_b8_224) batch=8 size=224 ;;
                r50_b32_224) batch=32 size=224 ;;
                *) echo "run_train_bench.sh: unknown ResNet config '$cfg'" >&2; exit 2 ;;
                esac
                if [ $((round % 2)) -eq 1 ]; then
                    run_loom $round "$cfg" "$amp" $batch $size
                    run_torch $round "$cfg" "$amp"
                else
                    run_torch $round "$cfg" "$amp"
                    run_loom $round "$cfg" "$amp" $batch $size
                fi
            done
        done
        round=$((round + 1))
    done
    cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
    /usr/bin/python3 "$here/bench_table.py" resnet "$tmp/loom.jsonl" "$tmp/torch.jsonl" "$markdown" \
        "${cpu:-unknown}"
    exit 0
fi

bench="$build/bench/bench_train"
if [ ! -x "$bench" ]; then
    echo "run_train_bench.sh: $bench not found: build it first (ninja -C $build)" >&2
    exit 1
fi

echo "Loom: $bench --threads $threads$common$loom_only" >&2
# shellcheck disable=SC2086
LOOM_NUM_THREADS=$threads "$bench" --json --threads "$threads" $common $loom_only > "$tmp/loom.jsonl"
echo "PyTorch: /usr/bin/python3 $here/torch_train.py --bench --threads $threads$common" >&2
# shellcheck disable=SC2086
OMP_NUM_THREADS=$threads /usr/bin/python3 "$here/torch_train.py" --bench --threads "$threads" \
    $common > "$tmp/torch.jsonl"

/usr/bin/python3 - "$tmp/loom.jsonl" "$tmp/torch.jsonl" "$markdown" "$here" <<'EOF'
import sys
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, sys.argv[4])
from bench_table import load_jsonl, print_table

def load(path):
    return {r["config"]: r for r in load_jsonl(path)}

loom, torch = load(sys.argv[1]), load(sys.argv[2])
markdown = sys.argv[3] == "1"
goals = {"mlp": 2.0, "cnn": 1.5}   # issue 4: Loom >= 2x PyTorch on the MLP, >= 1.5x on the CNN
head = ["config", "threads", "Loom samples/s", "PyTorch samples/s", "ratio", "goal",
        "Loom 1st step ms (compile)", "PyTorch 1st step ms", "Loom peak device MB",
        "PyTorch RSS MB (training)", "Loom interp samples/s"]
rows = []
for name in loom:
    l, t = loom[name], torch.get(name)
    if t is None:
        continue
    ratio = l["samples_per_sec"] / t["samples_per_sec"] if t["samples_per_sec"] else 0.0
    goal = goals[l["model"]]
    rows.append([name, str(l["threads"]), f'{l["samples_per_sec"]:.0f}',
                 f'{t["samples_per_sec"]:.0f}', f"{ratio:.2f}x",
                 f'>= {goal}x {"met" if ratio >= goal else "NOT met"}',
                 f'{l["first_step_ms"]:.0f} ({l["compile_ms"]:.0f})', f'{t["first_step_ms"]:.0f}',
                 f'{l["peak_device_memory_bytes"] / 1e6:.1f}',
                 f'{t["peak_rss_bytes"] / 1e6:.0f} ({t["train_rss_bytes"] / 1e6:.0f})',
                 f'{l["interp_samples_per_sec"]:.1f}' if l["interp_samples_per_sec"] else "-"])
print_table(head, rows, markdown)
any_torch = next(iter(torch.values()), {})
print(f'\nPyTorch {any_torch.get("torch_version", "?")} eager CPU; samples/s are medians of '
      f'timed runs after warm-up (--best: the best run). "training" RSS is the peak RSS less '
      f'the RSS before the model was built.')
EOF
