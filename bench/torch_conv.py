#!/usr/bin/python3
"""PyTorch (1.13, CPU, oneDNN) side of Loom's convolution benchmark (bench/bench_conv.c;
bench/run_conv_bench.sh runs both): each distinct convolution shape of torchvision's
ResNet-50 at 224x224, its forward, input gradient and weight gradient timed separately.

forward       torch.nn.functional.conv2d(x, w) under torch.no_grad()
grad_input    torch.nn.grad.conv2d_input(x.shape, w, dy), i.e. aten::convolution_backward
              with output_mask (True, False, False): what autograd runs for x's gradient
grad_weight   torch.nn.grad.conv2d_weight(x, w.shape, dy): the same with (False, True, False)

No bias, groups 1, NCHW contiguous tensors. --dtype bf16 makes x, w and dy bf16 tensors: the
oneDNN bf16 kernels torch.autocast('cpu', dtype=torch.bfloat16) would reach, without its
casts (the JSON's "bf16_mode" says so). Each pass: --warmup untimed calls, then the median
(--best: the fastest) of --reps timed calls, by the wall clock. One JSON object per layer and
pass with --json, else a table. Run it with Debian's /usr/bin/python3 (torch 1.13).
"""
import argparse
import json
import statistics
import sys
import time

import openblas_core  # before numpy and torch load OpenBLAS

OPENBLAS_CORE = openblas_core.pin()

import torch
import torch.nn.functional as F

# (name, in channels, out channels, input height = width, kernel, stride, uses): padding is
# kernel // 2. torchvision v1.5 puts a block's stride on its 3x3. Keep in step with layers[]
# in bench/bench_conv.c (run_conv_bench.sh joins the two sides by name and checks the shapes).
LAYERS = [
    ("stem_7x7s2_3_64", 3, 64, 224, 7, 2, 1),
    ("l1_1x1_64_64", 64, 64, 56, 1, 1, 1),
    ("l1_3x3_64_64", 64, 64, 56, 3, 1, 3),
    ("l1_1x1_64_256", 64, 256, 56, 1, 1, 4),
    ("l1_1x1_256_64", 256, 64, 56, 1, 1, 2),
    ("l2_1x1_256_128", 256, 128, 56, 1, 1, 1),
    ("l2_3x3s2_128_128", 128, 128, 56, 3, 2, 1),
    ("l2_1x1_128_512", 128, 512, 28, 1, 1, 4),
    ("l2_down_1x1s2_256_512", 256, 512, 56, 1, 2, 1),
    ("l2_3x3_128_128", 128, 128, 28, 3, 1, 3),
    ("l2_1x1_512_128", 512, 128, 28, 1, 1, 3),
    ("l3_1x1_512_256", 512, 256, 28, 1, 1, 1),
    ("l3_3x3s2_256_256", 256, 256, 28, 3, 2, 1),
    ("l3_1x1_256_1024", 256, 1024, 14, 1, 1, 6),
    ("l3_down_1x1s2_512_1024", 512, 1024, 28, 1, 2, 1),
    ("l3_3x3_256_256", 256, 256, 14, 3, 1, 5),
    ("l3_1x1_1024_256", 1024, 256, 14, 1, 1, 5),
    ("l4_1x1_1024_512", 1024, 512, 14, 1, 1, 1),
    ("l4_3x3s2_512_512", 512, 512, 14, 3, 2, 1),
    ("l4_1x1_512_2048", 512, 2048, 7, 1, 1, 3),
    ("l4_down_1x1s2_1024_2048", 1024, 2048, 14, 1, 2, 1),
    ("l4_3x3_512_512", 512, 512, 7, 3, 1, 2),
    ("l4_1x1_2048_512", 2048, 512, 7, 1, 1, 2),
]
PASSES = ["forward", "grad_input", "grad_weight"]


def conv_backend(x, w, stride, pad):
    """The backend aten::convolution picks for these operands ("Mkldnn" is oneDNN)."""
    try:
        b = torch._C._select_conv_backend(x, w, None, [stride] * 2, [pad] * 2, [1, 1], False,
                                          [0, 0], 1)
        return str(b).split(".")[-1]
    except (AttributeError, RuntimeError, TypeError):
        return "?"


def time_calls(fn, warmup, reps, best):
    for _ in range(warmup):
        fn()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return (min(t) if best else statistics.median(t)) * 1e3


def stage_hw(hw224, image):
    """The layer's input extent at image x image (224 -> 56 -> 28 -> 14 -> 7 at 224; 64 gives
    64, 16, 8, 4, 2): the stem 7x7/2 and max pool 3x3/2 before layer1, then a stride-2 conv per
    stage. Keep in step with stage_hw in bench_conv.c."""
    if hw224 == 224:
        return image
    hw = ((image + 6 - 7) // 2 + 1 + 2 - 3) // 2 + 1
    s = 56
    while s > hw224:
        hw = (hw + 2 - 3) // 2 + 1
        s //= 2
    return hw


def run_layer(args, layer):
    name, c, o, hw, k, stride, uses = layer
    hw = stage_hw(hw, args.image_size)
    pad = k // 2
    oh = (hw + 2 * pad - k) // stride + 1
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(args.batch, c, hw, hw, generator=g) * 2 - 1).to(dtype)
    bound = 1.0 / (c * k * k) ** 0.5
    w = ((torch.rand(o, c, k, k, generator=g) * 2 - 1) * bound).to(dtype)
    dy = (torch.rand(args.batch, o, oh, oh, generator=g) * 2 - 1).to(dtype)
    flops = 2.0 * args.batch * o * oh * oh * c * k * k
    calls = {
        "forward": lambda: F.conv2d(x, w, None, stride, pad),
        "grad_input": lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, stride, pad),
        "grad_weight": lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, stride, pad),
    }
    backend = conv_backend(x, w, stride, pad)
    rows = []
    with torch.no_grad():
        for p in args.passes:
            ms = time_calls(calls[p], args.warmup, args.reps, args.best)
            rows.append({"side": "torch", "layer": name, "pass": p, "dtype": args.dtype,
                         "batch": args.batch, "image_size": args.image_size,
                         "threads": args.threads, "c": c, "o": o, "h": hw,
                         "w": hw, "k": k, "stride": stride, "pad": pad, "oh": oh, "ow": oh,
                         "uses": uses, "flops": flops, "ms": round(ms, 4),
                         "gflops": round(flops / (ms * 1e-3) / 1e9, 2),
                         "stat": "best" if args.best else "median", "reps": args.reps,
                         "warmup": args.warmup, "backend": backend,
                         "bf16_mode": "bf16 tensors" if args.dtype == "bf16" else "none",
                         "torch_version": torch.__version__})
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--image-size", type=int, default=224,
                   help="the network's input images are N x N; each layer's input is its "
                        "stage's extent (64: 64, 16, 8, 4, 2)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--layer", action="append", default=[],
                   help="only these layers (repeatable, or comma-separated)")
    p.add_argument("--pass", dest="passes", default=",".join(PASSES),
                   help="comma-separated among " + ",".join(PASSES))
    p.add_argument("--best", action="store_true", help="the fastest call, not the median")
    p.add_argument("--json", action="store_true", help="one JSON object per layer and pass")
    p.add_argument("--list", action="store_true", help="print the layer names and exit")
    args = p.parse_args()
    if args.list:
        print("\n".join(layer[0] for layer in LAYERS))
        return 0
    names = {layer[0] for layer in LAYERS}
    wanted = [n for arg in args.layer for n in arg.split(",") if n]
    for n in wanted:
        if n not in names:
            p.error(f"unknown layer '{n}' (--list names them)")
    args.passes = [q for q in args.passes.split(",") if q]
    for q in args.passes:
        if q not in PASSES:
            p.error(f"unknown pass '{q}' ({', '.join(PASSES)})")
    if args.reps < 1 or args.warmup < 0 or args.batch < 1 or args.threads < 1:
        p.error("--reps, --batch and --threads must be >= 1, --warmup >= 0")
    if not 32 <= args.image_size <= 4096:
        p.error("--image-size must be in 32..4096")
    torch.set_num_threads(args.threads)
    if args.dtype == "bf16" and not torch.backends.mkldnn.is_available():
        print("torch_conv.py: warning: oneDNN (mkldnn) is not available; bf16 convolutions "
              "take PyTorch's slow path", file=sys.stderr)
    if not args.json:
        print(f"PyTorch {torch.__version__} ResNet-50 convolutions at {args.image_size}x"
              f"{args.image_size}, batch {args.batch}, "
              f"{args.dtype}{' (bf16 tensors)' if args.dtype == 'bf16' else ''}, "
              f"{args.threads} threads; ms: {'best' if args.best else 'median'} of {args.reps} "
              f"calls after {args.warmup} warm-up calls")
        print(f"{'layer':24} {'pass':11} {'ms':>9} {'GFLOP/s':>9}  backend")
    for layer in LAYERS:
        if wanted and layer[0] not in wanted:
            continue
        for r in run_layer(args, layer):
            if args.json:
                print(json.dumps(r))
            else:
                print(f"{r['layer']:24} {r['pass']:11} {r['ms']:9.3f} {r['gflops']:9.1f}  "
                      f"{r['backend']}")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
