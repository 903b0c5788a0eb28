#!/usr/bin/python3
"""Loom's training steps against PyTorch's, parameter by parameter.

From one initialisation and one batch file, trains K steps with Loom's example (build/examples/
resnet or fashion_mnist, its --init/--data/--save), and the same K steps in PyTorch in float64
(the truth) and in float32 (or under bf16 autocast with --amp bf16). For every float tensor of
the model's state_dict it prints the error of the update against float64's,

    max|D - D64| / max|D64|      (D = the tensor after the K steps minus before them),

Loom's and PyTorch's side by side: the median over the tensors, the worst and which tensor.

    bench/torch_crosscheck.py --model resnet18 --image-size 32 --steps 1,2,3
    bench/torch_crosscheck.py --model resnet18 --from-reference --data-seeds 1-8
    bench/torch_crosscheck.py --model cnn --steps 1,5,20
    LOOM_CONV=direct bench/torch_crosscheck.py --model resnet18   (the environment reaches Loom)

--from-reference measures each step K alone: Loom and PyTorch-f32 both start it from float64's
state after K-1 steps (the parameters, batch-norm statistics and SGD momentum in Loom's
checkpoint names), so the error of step K is not the amplified error of the steps before it
(ResNet only). Why it matters: a small ResNet on small images is chaotic. Its layer4 maps are
1x1 at 32x32 images, so a batch norm there sees batch-size values per channel, and a ReLU
input that lies within float32 rounding of zero may fall either way; where one does, the
gradient of that sample and channel is kept or dropped whole, and every later step inherits
the difference. Two float32 implementations then differ from float64 by 1e-2 or more after
two or three steps, each by its own luck; --data-seeds runs several batches and summarises.

Needs Debian's python3-torch and python3-torchvision (scripts/setup.sh --bench); without them
it prints why and exits 77. PyTorch runs with torch.set_num_threads(--threads); set
OMP_WAIT_POLICY=PASSIVE on shared 2-core machines (this script does when it is unset).
Exit status: 0 done, 1 a run failed, 2 usage error, 77 PyTorch missing.
"""
import argparse
import gzip
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_train as tt
except ImportError as e:
    print(f"torch_crosscheck.py: skipped: {e} (Debian's python3-torch, python3-torchvision and "
          f"python3-numpy for /usr/bin/python3: scripts/setup.sh --bench)", file=sys.stderr)
    sys.exit(77)

RESNETS = ("resnet18", "resnet50")


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


# ---- the model, its data and its optimizer, as Loom's examples build them -------------------

def make_model(args):
    if args.model in RESNETS:
        import torchvision
        return getattr(torchvision.models, args.model)(num_classes=args.num_classes)
    return tt.make_model(args.model)


def make_data(args, seed):
    """(images, labels) of steps * batch-size images: synthetic for ResNet (torch.randn and
    randint from a generator seeded `seed`), else the first Fashion-MNIST training images from
    image seed * steps * batch on."""
    n = args.max_steps * args.batch_size
    if args.model in RESNETS:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, 3, args.image_size, args.image_size, generator=g)
        return x, torch.randint(0, args.num_classes, (n,), generator=g)
    x, y, _, _ = tt.load_split(args.data_dir, "train")
    first = seed * n
    if first + n > x.shape[0]:
        raise ValueError(f"data seed {seed}: images {first}..{first + n} are past the training "
                         f"set's {x.shape[0]}")
    return x[first:first + n], y[first:first + n]


def make_optimizer(args, params):
    if args.optimizer == "sgd":
        return torch.optim.SGD(params, lr=args.lr, momentum=args.momentum,
                               weight_decay=args.weight_decay)
    return torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)


def train(args, init, x, y, dtype, steps, amp=False, momentum=None):
    """state_dict (float64 copies) after `steps` steps from `init`, and the SGD momentum
    buffers (parameter order) when asked to continue from `momentum`."""
    model = make_model(args)
    model.load_state_dict(init)
    model = model.to(dtype).train()
    opt = make_optimizer(args, model.parameters())
    if momentum is not None:  # resume: PyTorch's own state, so its first step uses them
        for p, buf in zip(model.parameters(), momentum):
            opt.state[p]["momentum_buffer"] = buf.to(dtype).clone()
    b = args.batch_size
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            out = model(x[s * b:(s + 1) * b].to(dtype))
        F.cross_entropy(out.float() if amp else out, y[s * b:(s + 1) * b]).backward()
        opt.step()
    bufs = [opt.state[p]["momentum_buffer"].detach().double() for p in model.parameters()
            if "momentum_buffer" in opt.state[p]]
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, bufs


# ---- files Loom's examples read ------------------------------------------------------------

def save_safetensors(path, tensors):
    """name -> tensor; floats as F32, integers as I64 (num_batches_tracked), sorted names."""
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        a = t.numpy().astype("<i8" if not t.is_floating_point() else "<f4")
        raw = a.tobytes()
        header[name] = {"dtype": "I64" if a.dtype.kind == "i" else "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


def write_idx(folder, split, x, y, rows=28, cols=28):
    """x normalised as load_split returns it, back to bytes; gzip'd IDX as Debian ships."""
    pixels = np.rint((x.numpy().reshape(-1, rows, cols) * 0.5 + 0.5) * 255).astype(np.uint8)
    with gzip.open(os.path.join(folder, f"{split}-images-idx3-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, pixels.shape[0], rows, cols) + pixels.tobytes())
    with gzip.open(os.path.join(folder, f"{split}-labels-idx1-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">II", 0x801, y.shape[0]) + y.numpy().astype(np.uint8).tobytes())


def run_loom(args, tmp, init, x, y, steps, momentum=None, step_count=0):
    """Loom's state_dict (torch tensors) after `steps` steps of its example from `init`."""
    init_path, out_path = os.path.join(tmp, "init.safetensors"), os.path.join(tmp, "out.safetensors")
    state = dict(init)
    if momentum is not None:  # the checkpoint names examples/train_util.c saves and loads
        for i, buf in enumerate(momentum):
            state[f"optimizer.state.{i}.momentum_buffer"] = buf
        state["optimizer.step"] = torch.tensor(float(step_count))
    save_safetensors(init_path, state)
    common = ["--init", init_path, "--save", out_path, "--no-shuffle", "--batch-size",
              str(args.batch_size), "--optimizer", args.optimizer, "--lr", str(args.lr),
              "--weight-decay", str(args.weight_decay), "--amp", args.amp]
    if args.optimizer == "sgd":
        common += ["--momentum", str(args.momentum)]
    n = steps * args.batch_size
    if args.model in RESNETS:
        data = os.path.join(tmp, "data.safetensors")
        save_safetensors(data, {"images": x[:n], "labels": y[:n]})
        cmd = [os.path.join(args.build, "examples", "resnet"), "--arch", args.model,
               "--num-classes", str(args.num_classes), "--data", data, "--eval-images", "0",
               "--max-steps", str(steps)] + common
    else:
        write_idx(tmp, "train", x[:n], y[:n])
        write_idx(tmp, "t10k", x[:10], y[:10])
        cmd = [os.path.join(args.build, "examples", "fashion_mnist"), "--model", args.model,
               "--data-dir", tmp, "--limit-steps", str(steps)] + common
    env = dict(os.environ)
    if args.eager:
        env["LOOM_EAGER"] = "1"
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-2000:]}")
    return {k: torch.from_numpy(v) for k, v in tt.load_safetensors(out_path).items()}


# ---- the comparison ------------------------------------------------------------------------

def errors(before, truth, got):
    """[(error, name)] over the float tensors whose float64 update is not zero."""
    out = []
    for name, t64 in truth.items():
        if not t64.is_floating_point():
            if name in got and int(got[name].reshape(-1)[0]) != int(t64.reshape(-1)[0]):
                out.append((float("inf"), name))
            continue
        b = before[name].double()
        d64 = t64.double() - b
        den = d64.abs().max().item()
        if den > 0:
            out.append((((got[name].double() - b) - d64).abs().max().item() / den, name))
    return sorted(out)


def summary(errs):
    return errs[len(errs) // 2][0], errs[-1][0], errs[-1][1]


def parse_seeds(text):
    seeds = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        seeds += list(range(int(lo), int(hi or lo) + 1))
    return seeds


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=RESNETS + ("cnn", "mlp"), default="resnet18")
    p.add_argument("--image-size", type=int, default=32, help="ResNet images (default 32)")
    p.add_argument("--num-classes", type=int, default=1000, help="ResNet classes (default 1000)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", default="1,2,3", help="values of K (default 1,2,3)")
    p.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--amp", choices=["none", "bf16"], default="none",
                   help="bf16: Loom's --amp bf16 against torch.autocast('cpu', bfloat16)")
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed of the init (default 0)")
    p.add_argument("--data-seeds", default="7",
                   help="batches to run, e.g. 7 or 1-8 (ResNet: the generator's seed; "
                        "Fashion-MNIST: which run of steps*batch images; default 7)")
    p.add_argument("--from-reference", action="store_true",
                   help="each step K from float64's state after K-1 steps (ResNet, SGD)")
    p.add_argument("--eager", action="store_true", help="Loom with LOOM_EAGER=1 (slow)")
    p.add_argument("--build", default="build", help="Meson build folder (default build)")
    p.add_argument("--data-dir", default=tt.DEFAULT_DATA_DIR)
    p.add_argument("--threads", type=int, default=tt.default_threads())
    p.add_argument("--json", action="store_true", help="one JSON line per row")
    args = p.parse_args()
    try:
        ks = sorted({int(k) for k in args.steps.split(",")})
        seeds = parse_seeds(args.data_seeds)
    except ValueError:
        p.error("--steps and --data-seeds take integers: 1,2,3 or 1-8")
    if ks[0] < 1 or args.batch_size < 1:
        p.error("--steps and --batch-size must be >= 1")
    if args.from_reference and (args.model not in RESNETS or args.optimizer != "sgd"):
        p.error("--from-reference resumes ResNet with SGD only (its checkpoint names)")
    args.max_steps = ks[-1]
    torch.set_num_threads(args.threads)
    ref = "PyTorch-bf16" if args.amp == "bf16" else "PyTorch-f32"
    if not args.json:
        print(f"{args.model}" + (f", {args.image_size}x{args.image_size} images"
                                 if args.model in RESNETS else "") +
              f", batch {args.batch_size}, {args.optimizer} lr {args.lr}" +
              (f" momentum {args.momentum}" if args.optimizer == "sgd" else "") +
              f" weight decay {args.weight_decay}, amp {args.amp}, LOOM_CONV="
              f"{os.environ.get('LOOM_CONV', 'default')}{', LOOM_EAGER=1' if args.eager else ''}; "
              f"{'each step from float64' if args.from_reference else 'K steps from the init'}")
        print(f"CPU {cpu_name()}; PyTorch {torch.__version__} on {args.threads} threads, "
              f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
        print("error of each tensor's update against PyTorch float64: max|D - D64| / max|D64|")
        print(f"{'seed':>4} {'K':>2}  {'Loom median':>11} {'Loom worst':>10}  {'tensor':<28} "
              f"{ref + ' median':>19} {'worst':>9}  {'tensor':<28} {'worst ratio':>11}")
    torch.manual_seed(args.seed)
    init = make_model(args).state_dict()
    ratios, failed = [], False
    with tempfile.TemporaryDirectory(prefix="loom-crosscheck-") as tmp:
        for seed in seeds:
            x, y = make_data(args, seed)
            b = args.batch_size
            for k in ks:
                try:
                    if args.from_reference:  # float64's state before step k, then step k alone
                        start, bufs = train(args, init, x, y, torch.float64, k - 1)
                        start = {n: (v.float() if v.is_floating_point() else v)
                                 for n, v in start.items()}
                        xs, ys = x[(k - 1) * b:k * b], y[(k - 1) * b:k * b]
                        mom = bufs if k > 1 else None
                        truth, _ = train(args, start, xs, ys, torch.float64, 1, momentum=mom)
                        other, _ = train(args, start, xs, ys, torch.float32, 1,
                                         amp=args.amp == "bf16", momentum=mom)
                        loom = run_loom(args, tmp, start, xs, ys, 1,
                                        [m.float() for m in mom] if mom else None, k - 1)
                    else:
                        start = init
                        truth, _ = train(args, init, x, y, torch.float64, k)
                        other, _ = train(args, init, x, y, torch.float32, k,
                                         amp=args.amp == "bf16")
                        loom = run_loom(args, tmp, init, x, y, k)
                except (RuntimeError, OSError, ValueError) as e:
                    print(f"torch_crosscheck.py: seed {seed}, K = {k}: {e}", file=sys.stderr)
                    failed = True
                    continue
                lm, lw, lt = summary(errors(start, truth, loom))
                om, ow, ot = summary(errors(start, truth, other))
                ratio = lw / ow if ow > 0 else float("inf")
                ratios.append(ratio)
                if args.json:
                    print(json.dumps({"model": args.model, "seed": seed, "k": k,
                                      "from_reference": args.from_reference, "amp": args.amp,
                                      "conv": os.environ.get("LOOM_CONV", "default"),
                                      "loom_median": lm, "loom_worst": lw, "loom_worst_tensor": lt,
                                      "ref": ref, "ref_median": om, "ref_worst": ow,
                                      "ref_worst_tensor": ot, "cpu": cpu_name()}), flush=True)
                else:
                    print(f"{seed:>4} {k:>2}  {lm:>11.2e} {lw:>10.2e}  {lt:<28.28} {om:>19.2e} "
                          f"{ow:>9.2e}  {ot:<28.28} {ratio:>11.2f}", flush=True)
    if ratios and not args.json:
        within = sum(r <= 3 for r in ratios)
        print(f"Loom's worst within 3x {ref}'s in {within} of {len(ratios)} rows; median ratio "
              f"{statistics.median(ratios):.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
