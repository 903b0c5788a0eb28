#!/usr/bin/python3
"""Where a data-parallel step's time goes, from LOOM_TRACE Chrome traces (one per rank).

For each trace, per step (the "step" events from --from-step on): the period (wall time
from the first counted step's start to the last one's end, per step: it includes the device
idling between steps while the host traces the next), the time inside step events, inside
"kernel" events, inside "collective" events (a collective's event spans its start to the
end of its wait), the part of that collective time that overlaps no kernel event of the same
trace ("not overlapped": the rank was copying into a bucket or waiting for it, not
computing), the wall time during which some collective was in flight and no kernel ran
("exposed": not overlapped without counting concurrent buckets twice), and the time from a
step's start to its first kernel (the step's agreement all-reduce, which checks that the
ranks run the same collectives, and set-up). The share of all-reduce time not overlapped is
sum(not overlapped) / sum(collective time) over the collectives.

A kernel event spans the kernel and, while a collective is in flight, the MPI_Test poll
after it (runtime/program.c), so MPI's progress inside those polls counts as kernel time
here, that is as overlapped: on a machine with no idle core the communication is CPU work
either way.

    bench/trace_overlap.py [--from-step N] [--json] TRACE.json...

--from-step N: the first step counted (default 22: bench_train's parameter broadcast is step
0, its first step 1, its 20 warm-up steps 2-21). --json: one JSON line per trace and one for
all of them together, instead of the table.
"""
import argparse
import json
import sys


def union_overlap(a0, a1, intervals, start):
    """Time of [a0, a1) covered by the sorted, disjoint intervals from index start on."""
    covered = 0.0
    i = start
    while i < len(intervals) and intervals[i][0] < a1:
        b0, b1 = intervals[i]
        covered += max(0.0, min(a1, b1) - max(a0, b0))
        i += 1
    return covered


def merge(intervals):
    out = []
    for b0, b1 in sorted(intervals):
        if out and b0 <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b1)
        else:
            out.append([b0, b1])
    return out


def analyse(path, from_step):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    steps = []
    for e in events:
        if e.get("cat") == "step" and e["name"].startswith("step "):
            n = int(e["name"].split()[1])
            if n >= from_step:
                steps.append((e["ts"], e["ts"] + e["dur"]))
    if not steps:
        raise ValueError(f"{path}: no step events from step {from_step} on")
    steps.sort()
    lo, hi = steps[0][0], steps[-1][1]
    kernels = merge([(e["ts"], e["ts"] + e["dur"]) for e in events
                     if e.get("cat") == "kernel" and lo <= e["ts"] < hi])
    colls = [e for e in events if e.get("cat") == "collective" and lo <= e["ts"] < hi]
    def not_overlapped(intervals):
        total = 0.0
        for a0, a1 in intervals:
            first = next((i for i, k in enumerate(kernels) if k[1] > a0), len(kernels))
            total += (a1 - a0) - union_overlap(a0, a1, kernels, first)
        return total

    spans = [(e["ts"], e["ts"] + e["dur"]) for e in colls]
    coll_us = sum(a1 - a0 for a0, a1 in spans)
    not_overlapped_us = not_overlapped(spans)
    exposed_us = not_overlapped(merge(spans))
    pre_us = 0.0
    for s0, s1 in steps:
        first = next((k[0] for k in kernels if k[0] >= s0), s1)
        pre_us += min(first, s1) - s0
    n = len(steps)
    rank = next((e.get("pid", 0) for e in events if e.get("cat") == "step"), 0)
    return {"trace": path, "rank": rank, "steps": n,
            "period_ms": (hi - lo) / n / 1e3,
            "step_ms": sum(s1 - s0 for s0, s1 in steps) / n / 1e3,
            "kernel_ms": sum(k1 - k0 for k0, k1 in kernels) / n / 1e3,
            "collectives_per_step": len(colls) / n,
            "collective_ms": coll_us / n / 1e3, "not_overlapped_ms": not_overlapped_us / n / 1e3,
            "not_overlapped_share": not_overlapped_us / coll_us if coll_us else 0.0,
            "exposed_ms": exposed_us / n / 1e3,
            "pre_kernel_ms": pre_us / n / 1e3,
            "collective_bytes": max((e["args"].get("bytes", 0) for e in colls), default=0)}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACE.json")
    p.add_argument("--from-step", type=int, default=22)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    try:
        rows = [analyse(t, args.from_step) for t in args.traces]
    except (OSError, ValueError, KeyError) as e:
        print(f"trace_overlap.py: {e}", file=sys.stderr)
        sys.exit(1)
    coll = sum(r["collective_ms"] * r["steps"] for r in rows)
    exposed = sum(r["not_overlapped_ms"] * r["steps"] for r in rows)
    total = {"trace": "all", "not_overlapped_share": exposed / coll if coll else 0.0}
    if args.json:
        for r in rows + [total]:
            print(json.dumps(r))
        return
    print("per step, ms:")
    print(f'{"rank":>4} {"steps":>5} {"period":>8} {"step":>8} {"kernels":>8} {"pre-kernel":>10} '
          f'{"colls":>5} {"coll":>8} {"not overlapped":>14} {"share":>6} {"exposed":>8}')
    for r in rows:
        print(f'{r["rank"]:>4} {r["steps"]:>5} {r["period_ms"]:>8.3f} {r["step_ms"]:>8.3f} '
              f'{r["kernel_ms"]:>8.3f} {r["pre_kernel_ms"]:>10.3f} '
              f'{r["collectives_per_step"]:>5.1f} {r["collective_ms"]:>8.3f} '
              f'{r["not_overlapped_ms"]:>14.3f} {r["not_overlapped_share"]:>6.1%} '
              f'{r["exposed_ms"]:>8.3f}')
    print(f'all ranks: {total["not_overlapped_share"]:.1%} of all-reduce time overlaps no kernel')


if __name__ == "__main__":
    main()
