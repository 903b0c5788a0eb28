#!/usr/bin/python3
"""Where a training step's convolution time goes, against the floor of its multiply-adds.

Reads a run's kernel profile (the stderr of LOOM_PROFILE=all) and its plan (LOOM_DUMP), and
prints, per kind of convolution (pass, window, stride, direct or Winograd), the time per step
against the time the kernels' multiply-adds take at a given GEMM rate: the floor. A direct
convolution's floor is its FLOPs (2 N O OH OW C KH KW) over the rate; a Winograd one's is that
over the multiplies Winograd saves (2.25 for F(2x2, 3x3), 4 for F(4x4, 3x3)), as if its
transforms cost nothing. The rest, `loss`, is what staging, packing, epilogues, transforms,
edge tiles and idle threads cost beyond the multiply-adds. Other kernels (pooling, the
classifier's matmul) are listed by root op. The sum is a bound on what faster convolution
kernels could save, not a forecast.

    LOOM_PROFILE=all LOOM_DUMP=/tmp/d build/examples/resnet --arch resnet50 \\
        --batch-size 8 --image-size 224 --amp bf16 --max-steps 8 --eval-images 0 2> prof.txt
    bench/conv_floor.py --profile prof.txt --dump /tmp/d --rate 430

--rate is the GEMM rate in GFLOP/s of all the threads the step ran on: for example
`build/bench/bench_gemm --dtype bf16 --threads 1 --shape 1024x1024x1024 --best` (Loom's
column) times the threads. Which convolutions run as Winograd follows codegen/conv_winograd.c's
rule (cv_wino_ok, wino_tile) for LOOM_CONV unset: 3x3 of stride 1, dilation 1 and one group,
the summed channels in 16s (forward: C, input gradient: O; the weight gradient: C and O 16 or
more), a destination at least 7 wide where the GEMMs multiply bf16 pairs (F(2x2, 3x3);
vdpbf16ps, on CPUs with AVX512-BF16: else say --no-pairs), 3 wide where they multiply f32
(f32, f16, bf16 without pairs: F(4x4, 3x3) from 13 wide, 25 for the weight gradient). A step
compiled with LOOM_CONV set needs --winograd none|2|4 to say so.
"""
import argparse
import collections
import glob
import os
import re
import sys


def matches(path, pattern):
    """The lines of file path that regex pattern matches at their start, as match objects."""
    pat = re.compile(pattern)
    with open(path) as f:
        for line in f:
            m = pat.match(line)
            if m:
                yield m


def read_graph(path):
    """node id -> (op, operand ids, attrs text, type text) of a .loom graph dump."""
    nodes = {}
    for m in matches(path, r"\s+%(\d+) = (\w+)(.*?)(\{.*\})? : (\S+\[[^\]]*\]|\S+)"):
        ins = [int(x) for x in re.findall(r"%(\d+)", m.group(3))]
        nodes[int(m.group(1))] = (m.group(2), ins, m.group(4) or "", m.group(5))
    return nodes


def read_roots(path):
    """kernel index -> root node id of a plan dump."""
    return {int(m.group(1)): int(m.group(2))
            for m in matches(path, r"kernel (\d+): \w+, root %(\d+)")}


def shape(ty):
    m = re.search(r"\[([^\]]*)\]", ty)
    return [int(x) for x in m.group(1).split(",")] if m and m.group(1) else []


def dtype(ty):
    return ty.split("[", 1)[0]


def attr(attrs, name):
    m = re.search(name + r" = \[(\d+), (\d+)\]", attrs)
    return (int(m.group(1)), int(m.group(2))) if m else (1, 1)


def groups(attrs):
    m = re.search(r"groups = (\d+)", attrs)
    return int(m.group(1)) if m else 1


def winograd_saving(nodes, n, forced, bf16_pairs):
    """The multiplies Winograd saves on conv node n (1: it runs direct)."""
    name, ins, attrs, ty = nodes[n]
    if name == "conv2d_grad_weight":
        w = shape(ty)
        dy = shape(nodes[ins[1]][3]) if len(ins) > 1 else []
    else:
        w = shape(nodes[ins[1]][3]) if len(ins) > 1 else []
        dy = shape(ty) if name == "conv2d" else shape(nodes[ins[0]][3])
    if len(w) != 4 or len(dy) != 4 or forced == "none":
        return 1.0
    if (w[2], w[3]) != (3, 3) or attr(attrs, "stride") != (1, 1) or \
            attr(attrs, "dilation") != (1, 1) or groups(attrs) != 1:
        return 1.0
    o, c = w[0], w[1]
    pairs = bf16_pairs and dtype(ty) == "bf16"
    width = shape(ty)[3] if name != "conv2d_grad_weight" else dy[3]
    if forced in ("2", "4"):
        return 2.25 if forced == "2" else 4.0
    if (width + 1) // 2 < (4 if pairs else 2):
        return 1.0
    if name == "conv2d_grad_weight":
        if c < 16 or o < 16:
            return 1.0
        return 4.0 if not pairs and (width + 3) // 4 >= 7 else 2.25
    summed = c if name == "conv2d" else o
    if summed % 16:
        return 1.0
    return 4.0 if not pairs and (width + 3) // 4 >= 4 else 2.25


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True, help="LOOM_PROFILE=all output (stderr)")
    ap.add_argument("--dump", required=True, help="the same run's LOOM_DUMP folder")
    ap.add_argument("--rate", type=float, required=True,
                    help="GEMM GFLOP/s of all the step's threads")
    ap.add_argument("--steps", type=int, default=0,
                    help="steps the profile summed (default: the most calls of a kernel)")
    ap.add_argument("--winograd", choices=("auto", "none", "2", "4"), default="auto",
                    help="LOOM_CONV's choice when the step was compiled with it set")
    ap.add_argument("--no-pairs", action="store_true",
                    help="the step ran on a CPU without AVX512-BF16 (bf16 GEMMs in f32)")
    args = ap.parse_args()

    rows = []
    with open(args.profile) as f:
        for line in f:
            p = line.split()
            if len(p) >= 12 and p[0].isdigit() and ":" in p[9]:
                prog, idx = p[9].split(":")
                rows.append((prog, int(idx), float(p[1]), int(p[3]), float(p[5]), p[8]))
    if not rows:
        sys.exit("conv_floor: no kernel rows in %s (run with LOOM_PROFILE=all)" % args.profile)
    steps = args.steps or max(r[3] for r in rows)
    if args.rate <= 0:
        sys.exit("conv_floor: --rate must be positive (GFLOP/s), got %g" % args.rate)
    graphs = {}
    by = collections.defaultdict(lambda: [0.0, 0.0, 0])
    other = collections.defaultdict(float)
    for prog, idx, total_ms, calls, gflops, kind in rows:
        if prog not in graphs:
            plans = glob.glob(os.path.join(args.dump, "step*-%s.plan.txt" % prog))
            passes = sorted(glob.glob(os.path.join(args.dump, "step*-%s.[0-9]*.loom" % prog)))
            if not plans or not passes:
                sys.exit("conv_floor: no plan and graph of program %s in %s" % (prog, args.dump))
            graphs[prog] = (read_roots(plans[0]), read_graph(passes[-1]))
        roots, nodes = graphs[prog]
        ms = total_ms / steps
        n = roots.get(idx)
        if n not in nodes:
            sys.exit("conv_floor: kernel %s:%d of the profile is not in %s's plan and graph "
                     "(a truncated or mismatched LOOM_DUMP folder?)" % (prog, idx, args.dump))
        op = nodes[n][0]
        if kind not in ("rooted", "matmul") or not op.startswith("conv2d"):
            other["%s %s" % (kind, op)] += ms
            continue
        name, ins, attrs, ty = nodes[n]
        w = shape(ty) if name == "conv2d_grad_weight" else shape(nodes[ins[1]][3])
        save = winograd_saving(nodes, n, args.winograd, not args.no_pairs)
        st = attr(attrs, "stride")
        how = "direct" if save == 1.0 else "F(2x2,3x3)" if save == 2.25 else "F(4x4,3x3)"
        key = "%-19s %dx%d s%d %s" % (name, w[2], w[3], st[0], how)
        flops = gflops * total_ms * 1e6 / steps  # per step
        b = by[key]
        b[0] += ms
        b[1] += flops / save / args.rate / 1e6
        b[2] += 1
    print("ms a step over %d steps at %.0f GFLOP/s; floor: the multiply-adds alone" %
          (steps, args.rate))
    print("%-40s %7s %9s %9s %9s %6s" % ("convolutions", "kernels", "ms", "floor", "loss",
                                         "floor%"))
    tot = [0.0, 0.0]
    for key, (ms, fl, k) in sorted(by.items(), key=lambda x: -(x[1][0] - x[1][1])):
        print("%-40s %7d %9.1f %9.1f %9.1f %5.0f%%" % (key, k, ms, fl, ms - fl,
                                                        100 * fl / ms if ms > 0 else 0))
        tot[0] += ms
        tot[1] += fl
    if tot[0] > 0:
        print("%-40s %7s %9.1f %9.1f %9.1f %5.0f%%" % ("all convolutions", "", tot[0], tot[1],
                                                        tot[0] - tot[1], 100 * tot[1] / tot[0]))
    print("%-40s %9s" % ("other kernels", "ms"))
    for key, ms in sorted(other.items(), key=lambda x: -x[1]):
        print("%-40s %9.1f" % (key, ms))


if __name__ == "__main__":
    try:
        main()
    except OSError as e:
        sys.exit("conv_floor: %s" % e)
    except (KeyError, IndexError) as e:
        sys.exit("conv_floor: the dump's graph lacks a node the plan names (%s): a truncated "
                 "or mismatched LOOM_DUMP folder?" % e)
