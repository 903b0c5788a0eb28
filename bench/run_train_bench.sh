#!/bin/sh
# Training throughput, Loom vs PyTorch 1.13 eager on CPU, side by side: runs
# build/bench/bench_train and bench/torch_train.py --bench with the same thread count,
# batches and optimizer, then prints one table with the ratios (bench/README.md).
set -eu

usage() {
    cat <<'EOF'
Usage: bench/run_train_bench.sh [--build DIR] [--threads N] [--runs N] [--steps N]
                                [--warmup N] [--interp-steps N] [--config LIST]
                                [--optimizer sgd|adam|adamw] [--best] [--markdown]
  --build DIR       Meson build folder holding bench/bench_train (default: build)
  --threads N       threads on both sides (default LOOM_NUM_THREADS, else all cores)
  --markdown        print the table as Markdown
The other options go to both sides (--interp-steps to Loom only).
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
build="$here/../build"
threads="${LOOM_NUM_THREADS:-$(nproc)}"
common=""
loom_only=""
markdown=0
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --runs|--steps|--warmup|--config|--optimizer) common="$common $1 $2"; shift 2 ;;
    --interp-steps) loom_only="$loom_only $1 $2"; shift 2 ;;
    --best) common="$common --best"; shift ;;
    --markdown) markdown=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_train_bench.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
done

bench="$build/bench/bench_train"
if [ ! -x "$bench" ]; then
    echo "run_train_bench.sh: $bench not found: build it first (ninja -C $build)" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

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
