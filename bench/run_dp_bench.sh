#!/bin/sh
# Data-parallel training throughput (issue 10), side by side in one run: Loom 2 ranks x 1
# thread (mpiexec), Loom 1 rank x 2 threads and PyTorch DDP (gloo) 2 processes x 1 thread,
# on the same global batch, model and optimizer; rounds interleave the three sides per
# configuration and the table gives each round and the medians' ratios. Then the share of
# Loom's all-reduce time that overlaps no kernel (LOOM_TRACE traces of separate runs, read by
# trace_overlap.py), a bucket-size sweep (LOOM_ALLREDUCE_BUCKET_MB) and bench_allreduce's
# 25 MB line. Results and how to read them: bench/README.md.
set -eu

usage() {
    cat <<'EOF'
Usage: bench/run_dp_bench.sh [--build DIR] [--rounds N] [--runs N] [--steps N] [--warmup N]
                             [--config LIST] [--sweep-config C] [--buckets LIST]
                             [--no-sweep] [--no-allreduce] [--markdown]
  --build DIR       Meson build folder holding bench/bench_train (default: build)
  --rounds N        interleaved rounds of the three sides, and of the sweep (default 3)
  --config LIST     configurations; their batch is the global batch (default
                    mlp64,mlp256,cnn64)
  --sweep-config C  the bucket sweep's configuration (default cnn64)
  --buckets LIST    the sweep's LOOM_ALLREDUCE_BUCKET_MB values (default 0,1,5,25,inf)
  --no-sweep        skip the bucket sweep
  --no-allreduce    skip bench_allreduce's 25 MB line
  --markdown        print the tables as Markdown
--runs, --steps and --warmup go to every side (their defaults: 7, 20, 20).
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
build="$here/../build"
rounds=3
configs="mlp64,mlp256,cnn64"
sweep_config=cnn64
buckets="0,1,5,25,inf"
sweep=1
allreduce=1
markdown=0
warmup=20
common=""
while [ $# -gt 0 ]; do
    case "$1" in
    --build|--rounds|--config|--sweep-config|--buckets|--runs|--steps|--warmup)
        if [ $# -lt 2 ]; then
            echo "run_dp_bench.sh: $1 needs a value" >&2; usage >&2; exit 2
        fi
        case "$1" in
        --build) build=$2 ;;
        --rounds) rounds=$2 ;;
        --config) configs=$2 ;;
        --sweep-config) sweep_config=$2 ;;
        --buckets) buckets=$2 ;;
        --warmup) warmup=$2; common="$common $1 $2" ;;
        *) common="$common $1 $2" ;;
        esac
        shift 2 ;;
    --no-sweep) sweep=0; shift ;;
    --no-allreduce) allreduce=0; shift ;;
    --markdown) markdown=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_dp_bench.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
for n in "$rounds" "$warmup"; do
    case "$n" in
    ''|*[!0-9]*) echo "run_dp_bench.sh: '$n' is not a count" >&2; usage >&2; exit 2 ;;
    esac
done
[ "$rounds" -ge 1 ] || { echo "run_dp_bench.sh: --rounds must be >= 1" >&2; exit 2; }
configs=$(echo "$configs" | tr , ' ')
buckets=$(echo "$buckets" | tr , ' ')
for c in $configs $sweep_config; do
    case "$c" in
    mlp64|mlp256|cnn64) ;;
    *) echo "run_dp_bench.sh: unknown config '$c' (mlp64, mlp256, cnn64)" >&2; exit 2 ;;
    esac
done

bench="$build/bench/bench_train"
if [ ! -x "$bench" ]; then
    echo "run_dp_bench.sh: $bench not found: build it first (ninja -C $build)" >&2
    exit 1
fi
if ! command -v mpiexec >/dev/null; then
    echo "run_dp_bench.sh: mpiexec not found (Debian: mpich)" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Under $wrap (set for traced runs) each process writes its own LOOM_TRACE file, named by
# the launcher's rank variable (MPICH's PMI_RANK, Open MPI's OMPI_COMM_WORLD_RANK).
cat > "$tmp/traced.sh" <<'EOF'
#!/bin/sh
LOOM_TRACE="$DP_TRACE.rank${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}.json" exec "$@"
EOF
chmod +x "$tmp/traced.sh"
wrap=""
bucket_mb="" # LOOM_ALLREDUCE_BUCKET_MB of Loom's runs; empty: the default (25)

# run_side SIDE CONFIG: one measurement, one JSON line on stdout. Each side's thread
# settings are given explicitly so that none inherits another's.
run_side() {
    case "$1" in
    loom2x1)
        # shellcheck disable=SC2086
        LOOM_NUM_THREADS=1 OMP_NUM_THREADS=1 LOOM_ALLREDUCE_BUCKET_MB=$bucket_mb \
            mpiexec -n 2 $wrap "$bench" --json \
            --interp-steps 0 --threads 1 --config "$2" $common ;;
    loom1x2)
        # shellcheck disable=SC2086
        LOOM_NUM_THREADS=2 LOOM_ALLREDUCE_BUCKET_MB=$bucket_mb $wrap "$bench" --json \
            --interp-steps 0 --threads 2 --config "$2" $common ;;
    ddp2x1)
        # shellcheck disable=SC2086
        OMP_NUM_THREADS=1 /usr/bin/python3 "$here/torch_train.py" --bench --world-size 2 \
            --threads 1 --config "$2" $common ;;
    esac
}

# trace NAME SIDE CONFIG: a traced Loom run; trace_overlap.py's JSON lines in $tmp/NAME.
trace() {
    wrap="$tmp/traced.sh"
    DP_TRACE="$tmp/$1"
    export DP_TRACE
    run_side "$2" "$3" > /dev/null
    wrap=""
    /usr/bin/python3 "$here/trace_overlap.py" --json --from-step $((warmup + 2)) \
        "$tmp/$1".rank*.json > "$tmp/$1"
}

load() { cut -d' ' -f1-3 /proc/loadavg; }
cpu="$(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, AVX512-BF16:"
cpu="$cpu $(grep -qw avx512_bf16 /proc/cpuinfo && echo yes || echo no), AMX:"
cpu="$cpu $(grep -qw amx_tile /proc/cpuinfo && echo yes || echo no)"
echo "$cpu; load average at start $(load)" >&2

# 1. Interleaved rounds, the sides' order rotating each round.
for r in $(seq 1 "$rounds"); do
    case $((r % 3)) in
    1) order="loom2x1 loom1x2 ddp2x1" ;;
    2) order="loom1x2 ddp2x1 loom2x1" ;;
    *) order="ddp2x1 loom2x1 loom1x2" ;;
    esac
    for c in $configs; do
        for side in $order; do
            echo "round $r: $c $side (load $(load))" >&2
            run_side "$side" "$c" >> "$tmp/$side"
        done
    done
done

# 2. Traced runs (tracing costs a little, so they are not the timed ones): Loom 2x1 for the
# overlap, 1x2 for its kernel time.
for c in $configs; do
    echo "traces: $c (load $(load))" >&2
    trace "overlap.$c.loom2x1" loom2x1 "$c"
    trace "overlap.$c.loom1x2" loom1x2 "$c"
done

# 3. The bucket sweep, interleaved the same way, each setting traced once.
if [ "$sweep" = 1 ]; then
    for r in $(seq 1 "$rounds"); do
        for b in $buckets; do
            echo "sweep round $r: $sweep_config LOOM_ALLREDUCE_BUCKET_MB=$b (load $(load))" >&2
            bucket_mb=$b
            run_side loom2x1 "$sweep_config" >> "$tmp/sweep.$b"
        done
    done
    for b in $buckets; do
        bucket_mb=$b
        trace "overlap.sweep.$b" loom2x1 "$sweep_config"
    done
    bucket_mb=""
fi
load_end=$(load)

/usr/bin/python3 - "$here" "$tmp" "$markdown" "$configs" "$sweep" "$sweep_config" \
    "$buckets" "$cpu" "$load_end" <<'EOF'
import os, statistics, sys
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, sys.argv[1])
from bench_table import load_jsonl, print_table

tmp, markdown = sys.argv[2], sys.argv[3] == "1"
configs, sweep, sweep_config = sys.argv[4].split(), sys.argv[5] == "1", sys.argv[6]
buckets, cpu, load_end = sys.argv[7].split(), sys.argv[8], sys.argv[9]

def rates(path, config=None):
    return [r["samples_per_sec"] for r in load_jsonl(path)
            if config is None or r["config"] == config]

def rounds(v):
    return " / ".join(f"{x:,.0f}".replace(",", " ") for x in v)

def overlap(name):
    """(per-rank rows, the share over all ranks) of trace_overlap.py's output."""
    rows = load_jsonl(os.path.join(tmp, name))
    return rows[:-1], rows[-1]["not_overlapped_share"]

head = ["config (global batch)", "Loom 2x1 samples/s", "Loom 1x2 samples/s",
        "DDP 2x1 samples/s", "2x1 / DDP (goal 1.5x)", "2x1 / 1x2 (goal 0.9x)",
        "all-reduce not overlapped", "kernel ms/step 2x1 (slowest rank) vs 1x2"]
rows, med1x2 = [], {}
for c in configs:
    l2, l1, dd = (rates(os.path.join(tmp, s), c) for s in ("loom2x1", "loom1x2", "ddp2x1"))
    m2, m1, md = statistics.median(l2), statistics.median(l1), statistics.median(dd)
    med1x2[c] = m1
    ranks, share = overlap(f"overlap.{c}.loom2x1")
    single, _ = overlap(f"overlap.{c}.loom1x2")
    slow = max(ranks, key=lambda r: r["kernel_ms"])
    coll = max(r["collective_ms"] for r in ranks)
    exposed = max(r["exposed_ms"] for r in ranks)
    rows.append([c, rounds(l2), rounds(l1), rounds(dd),
                 f'{m2 / md:.2f}x {"met" if m2 >= 1.5 * md else "NOT met"}',
                 f'{m2 / m1:.2f}x {"met" if m2 >= 0.9 * m1 else "NOT met"}',
                 f"{share:.0%} (exposed {exposed:.2f} of {coll:.2f} ms/step)",
                 f'{slow["kernel_ms"]:.2f} vs {single[0]["kernel_ms"]:.2f}'])
print(f"{cpu}; load average at the end {load_end}\n")
print_table(head, rows, markdown)
print("\nsamples/s of the global batch, one value per interleaved round (median of timed runs"
      "\nafter warm-up); ratios of the medians. Not overlapped: the share of the time in"
      "\nall-reduce events (start to end of wait) that overlaps no kernel, all ranks, from a"
      "\ntraced run (bench/trace_overlap.py); exposed: wall time per step with an all-reduce"
      "\nin flight and no kernel running, the rank with the most.")

if sweep:
    head = [f"LOOM_ALLREDUCE_BUCKET_MB ({sweep_config})", "buckets/step",
            "Loom 2x1 samples/s", "median", "vs Loom 1x2 median", "all-reduce not overlapped",
            "exposed ms/step", "step ms (traced)"]
    rows = []
    for b in buckets:
        v = rates(os.path.join(tmp, f"sweep.{b}"))
        ranks, share = overlap(f"overlap.sweep.{b}")
        m = statistics.median(v)
        ref = med1x2.get(sweep_config)
        rows.append([b, f'{ranks[0]["collectives_per_step"]:.0f}', rounds(v),
                     f"{m:,.0f}".replace(",", " "), f"{m / ref:.2f}x" if ref else "-",
                     f"{share:.0%}", f'{max(r["exposed_ms"] for r in ranks):.2f}',
                     f'{max(r["period_ms"] for r in ranks):.2f}'])
    print()
    print_table(head, rows, markdown)
EOF

# 4. Loom's all-reduce of 25 MB against a bare MPI_Allreduce of the same bytes.
if [ "$allreduce" = 1 ]; then
    if [ -x "$build/bench/bench_allreduce" ]; then
        echo
        mpiexec -n 2 "$build/bench/bench_allreduce" --mb 25
    else
        echo "run_dp_bench.sh: $build/bench/bench_allreduce not built (no MPI?): skipped" >&2
    fi
fi
