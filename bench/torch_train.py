#!/usr/bin/python3
"""PyTorch (1.13, eager, CPU) side of Loom's training comparison.

--bench           samples/s of the MLP at batch 64 and 256 and the CNN at batch 64 on
                  synthetic in-memory data, one JSON line per configuration (each measured
                  in a fresh process, so its peak RSS is its own); with --config r50_b32_64,
                  r50_b8_224 or r50_b32_224, torchvision's ResNet-50 at batch 32 on 64x64
                  images, batch 8 or 32 on 224x224 (1000 classes;
                  bench/run_train_bench.sh --resnet). With --world-size N:
                  DistributedDataParallel (gloo, default buckets) over N local processes of
                  --threads threads, each on its 1/N of the same global batch; global
                  samples/s, timed between barriers (bench/run_dp_bench.sh).
--fashion-mnist   trains the models of examples/fashion_mnist.c on the real IDX files with
                  the same flags and defaults, prints `step=<n> loss=<value>` lines as it
                  does, and one JSON line with the test accuracy at the end.

Needs only torch and numpy: the IDX files are read with gzip, and safetensors files
(--init/--save) are parsed and written by hand.
"""
import argparse
import gzip
import json
import math
import os
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import openblas_core  # before numpy and torch load OpenBLAS

OPENBLAS_CORE = openblas_core.pin()

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"
EVAL_BATCH = 500


# ---- models (layer names and layouts are those Loom's example uses) ------------------------

class MLP(nn.Module):
    def __init__(self, features=784):
        super().__init__()
        self.fc1 = nn.Linear(features, 512)
        self.fc2 = nn.Linear(512, 512)
        self.fc3 = nn.Linear(512, 10)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class CNN(nn.Module):
    def __init__(self, rows=28, cols=28):
        super().__init__()
        self.rows, self.cols = rows, cols
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(64 * ((rows - 4) // 2) * ((cols - 4) // 2), 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = x.view(-1, 1, self.rows, self.cols)
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


def make_model(kind, rows=28, cols=28):
    if kind == "resnet50":  # examples/resnet's model: torchvision's, 1000 classes
        import torchvision
        return torchvision.models.resnet50()
    return MLP(rows * cols) if kind == "mlp" else CNN(rows, cols)


def make_optimizer(args, params):
    """The example's defaults: sgd lr 0.01 momentum 0.9; adam/adamw lr 1e-3; weight decay 0
    (adamw: 0.01), as examples/fashion_mnist.c resolves them."""
    lr = args.lr if args.lr is not None else (0.01 if args.optimizer == "sgd" else 0.001)
    if args.optimizer == "sgd":
        momentum = args.momentum if args.momentum is not None else 0.9
        wd = args.weight_decay if args.weight_decay is not None else 0.0
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=wd)
    if args.momentum is not None:
        sys.exit("torch_train.py: --momentum applies to --optimizer sgd only")
    if args.optimizer == "adam":
        wd = args.weight_decay if args.weight_decay is not None else 0.0
        return torch.optim.Adam(params, lr=lr, weight_decay=wd)
    wd = args.weight_decay if args.weight_decay is not None else 0.01
    return torch.optim.AdamW(params, lr=lr, weight_decay=wd)


# ---- safetensors without the safetensors package --------------------------------------------

_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
              "I32": np.int32, "BOOL": np.bool_}


def load_safetensors(path):
    """name -> numpy array. Checks what a loader must: sizes, offsets, dtypes."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: {len(blob)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError(f"{path}: header length {n} exceeds the file")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _ST_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor '{name}': unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        need = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if not 0 <= begin <= end <= len(data) or end - begin != need:
            raise ValueError(f"{path}: tensor '{name}': data_offsets [{begin}, {end}] do not "
                             f"hold {shape} {info['dtype']} inside {len(data)} data bytes")
        out[name] = np.frombuffer(data[begin:end], dtype=np.dtype(dtype).newbyteorder("<"))
        out[name] = out[name].reshape(shape).copy()
    return out


def save_safetensors(path, tensors):
    """Writes name -> float32 tensor in safetensors layout (sorted names, 8-byte aligned)."""
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        a = tensors[name].detach().cpu().contiguous().numpy().astype("<f4")
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        chunks.append(b)
        offset += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_init(model, path):
    """strict load_state_dict from a safetensors file (names as model.state_dict())."""
    arrays = load_safetensors(path)
    state = model.state_dict()
    missing = sorted(set(state) - set(arrays))
    unexpected = sorted(set(arrays) - set(state))
    if missing or unexpected:
        raise ValueError(f"{path}: missing {missing}, unexpected {unexpected}")
    for name, a in arrays.items():
        if tuple(a.shape) != tuple(state[name].shape):
            raise ValueError(f"{path}: tensor '{name}' has shape {list(a.shape)}, the model "
                             f"needs {list(state[name].shape)}")
    model.load_state_dict({k: torch.from_numpy(v.astype(np.float32)) for k, v in arrays.items()})


# ---- data ------------------------------------------------------------------------------------

def read_idx(path, magic):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        blob = f.read()
    m, n = struct.unpack(">II", blob[:8])
    if m != magic:
        raise ValueError(f"{path}: magic {m:#010x}, expected {magic:#010x}")
    if magic == 0x803:
        rows, cols = struct.unpack(">II", blob[8:16])
        return np.frombuffer(blob, np.uint8, n * rows * cols, 16).reshape(n, rows, cols)
    return np.frombuffer(blob, np.uint8, n, 8)


def load_split(data_dir, split):
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"), 0x803)
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"), 0x801)
    n, rows, cols = images.shape
    # ToTensor then Normalize((0.5,), (0.5,)), computed as Loom's iterator does.
    x = (images.reshape(n, rows * cols).astype(np.float32) / np.float32(255) - np.float32(0.5)) \
        / np.float32(0.5)
    return torch.from_numpy(x), torch.from_numpy(labels.astype(np.int64)), rows, cols


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def default_threads():
    env = os.environ.get("LOOM_NUM_THREADS")
    return int(env) if env else os.cpu_count()


# ---- Fashion-MNIST training -------------------------------------------------------------------

def train_fashion_mnist(args):
    torch.manual_seed(args.seed)
    x_train, y_train, rows, cols = load_split(args.data_dir, "train")
    x_test, y_test, _, _ = load_split(args.data_dir, "t10k")
    model = make_model(args.model, rows, cols)
    if args.init:
        load_init(model, args.init)
    opt = make_optimizer(args, model.parameters())
    n = x_train.shape[0]
    per_epoch = n // args.batch_size  # drop_last, as the C example
    total = per_epoch * args.epochs
    if args.limit_steps:
        total = min(total, args.limit_steps)
    sched = None
    if args.lr_schedule == "cosine":  # per step, as the C example's --lr-schedule cosine
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
    step, final_loss, t0, stop = 0, None, None, False
    for epoch in range(args.epochs):
        if args.no_shuffle:
            order = None
        else:
            g = torch.Generator()
            g.manual_seed(args.seed + epoch)
            order = torch.randperm(n, generator=g)
        model.train()
        for b in range(per_epoch):
            if order is None:
                xb = x_train[b * args.batch_size:(b + 1) * args.batch_size]
                yb = y_train[b * args.batch_size:(b + 1) * args.batch_size]
            else:
                idx = order[b * args.batch_size:(b + 1) * args.batch_size]
                xb, yb = x_train[idx], y_train[idx]
            opt.zero_grad(set_to_none=True)
            with autocast(args):
                loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            if step == 0:
                t0 = time.perf_counter()
            if args.log_every and step % args.log_every == 0:
                print(f"step={step} loss={loss.item():.6f}", flush=True)
            final_loss = loss.item() if (b == per_epoch - 1 or step + 1 == args.limit_steps) \
                else final_loss
            step += 1
            if args.limit_steps and step >= args.limit_steps:
                stop = True
                break
        if not args.json:
            print(f"epoch {epoch + 1}/{args.epochs}: last loss {final_loss:.4f}", file=sys.stderr)
        if stop:
            break
    elapsed = time.perf_counter() - t0 if t0 is not None else 0.0
    if args.save:
        save_safetensors(args.save, model.state_dict())
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, x_test.shape[0], EVAL_BATCH):
            pred = model(x_test[i:i + EVAL_BATCH]).argmax(1)
            correct += int((pred == y_test[i:i + EVAL_BATCH]).sum())
    acc = correct / x_test.shape[0]
    # As the C example: timed from the end of the first step, which the others follow.
    sps = (step - 1) * args.batch_size / elapsed if step > 1 and elapsed > 0 else 0.0
    print(json.dumps({"side": "torch", "model": args.model, "optimizer": args.optimizer,
                      "amp": args.amp,
                      "batch_size": args.batch_size, "epochs": args.epochs, "steps": step,
                      "final_loss": None if final_loss is None else round(final_loss, 6),
                      "test_accuracy": round(acc, 4), "samples_per_sec": round(sps, 1),
                      "threads": torch.get_num_threads(),
                      "peak_rss_bytes": peak_rss_bytes()}))


def autocast(args):
    """The forward's autocast scope: bf16 on the CPU, or a no-op."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp == "bf16")


# ---- synthetic benchmark -----------------------------------------------------------------------

# name: (model, batch, image size); the ResNet ones run only when named in --config.
CONFIGS = {"mlp64": ("mlp", 64, 28), "mlp256": ("mlp", 256, 28), "cnn64": ("cnn", 64, 28),
           "r50_b32_64": ("resnet50", 32, 64), "r50_b8_224": ("resnet50", 8, 224),
           "r50_b32_224": ("resnet50", 32, 224)}
DEFAULT_CONFIGS = ["mlp64", "mlp256", "cnn64"]


def bench_one(args, name, rank=0, world=1):
    """One configuration; on several ranks (the process group initialized) this rank's part
    of DDP training on the same global batch, timed between barriers."""
    kind, batch, size = CONFIGS[name]
    rb = batch // world  # per-rank batch (run_bench checked that world divides it)
    torch.manual_seed(args.seed)
    rss_before = current_rss_bytes()
    model = make_model(kind)
    if world > 1:  # broadcasts rank 0's parameters, as Loom's loom_broadcast_parameters
        model = nn.parallel.DistributedDataParallel(model)
    opt = make_optimizer(args, model.parameters())
    g = torch.Generator()
    g.manual_seed(1)
    shape, classes = ((3, size, size), 1000) if kind == "resnet50" else ((784,), 10)
    x = torch.randn(batch, *shape, generator=g)[rank * rb:(rank + 1) * rb]
    y = torch.randint(0, classes, (batch,), generator=g)[rank * rb:(rank + 1) * rb]
    # Every rank done: a run timed on rank 0 between barriers ends with the slowest rank.
    sync = dist.barrier if world > 1 else (lambda: None)

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast(args):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    sync()
    t = time.perf_counter()
    loss0 = step()
    sync()
    first_ms = (time.perf_counter() - t) * 1e3
    if world > 1:  # the global batch's mean loss, as Loom's first_loss
        loss0 = loss0.detach()
        dist.all_reduce(loss0)
        loss0 /= world
    for _ in range(args.warmup):
        step()
    rates = []
    for _ in range(args.runs):
        sync()
        t = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync()
        rates.append(args.steps * batch / (time.perf_counter() - t))
    rate = max(rates) if args.best else statistics.median(rates)
    return {"side": "torch", "config": name, "model": kind, "batch": batch, "image_size": size,
            "threads": torch.get_num_threads(), "world_size": world, "batch_per_rank": rb,
            "optimizer": args.optimizer, "amp": args.amp,
            "samples_per_sec": round(rate, 1), "step_ms": round(batch / rate * 1e3, 3),
            "first_step_ms": round(first_ms, 2), "first_loss": round(float(loss0), 6),
            "peak_rss_bytes": peak_rss_bytes(),
            "train_rss_bytes": max(0, peak_rss_bytes() - rss_before),
            "torch_version": torch.__version__}


def usage_exit(msg):
    print(f"torch_train.py: {msg}", file=sys.stderr)
    sys.exit(2)


def ddp_worker(rank, args, name, store):
    """One DDP rank (torch.multiprocessing.spawn): its own threads, gloo over a file store."""
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank,
                            world_size=args.world_size)
    r = bench_one(args, name, rank, args.world_size)
    if rank == 0:
        print(json.dumps(r), flush=True)
    dist.destroy_process_group()


def run_bench(args):
    names = args.config.split(",") if args.config else DEFAULT_CONFIGS
    for name in names:
        if name not in CONFIGS:
            usage_exit(f"unknown config '{name}' (have {', '.join(CONFIGS)})")
        if CONFIGS[name][1] % args.world_size:
            usage_exit(f"{name}: its batch {CONFIGS[name][1]} is not a multiple of "
                       f"--world-size {args.world_size}")
    if args.bench_one and args.world_size > 1:
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(ddp_worker, args=(args, names[0], os.path.join(tmp, "store")),
                     nprocs=args.world_size)
        return
    if args.bench_one:
        print(json.dumps(bench_one(args, names[0])), flush=True)
        return
    # One process per configuration: peak RSS is then that configuration's alone.
    for name in names:
        cmd = [sys.executable, os.path.abspath(__file__), "--bench", "--bench-one",
               "--config", name, "--threads", str(args.threads), "--runs", str(args.runs),
               "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--optimizer", args.optimizer, "--seed", str(args.seed), "--amp", args.amp,
               "--world-size", str(args.world_size)]
        for flag, v in (("--lr", args.lr), ("--momentum", args.momentum),
                        ("--weight-decay", args.weight_decay)):
            if v is not None:
                cmd += [flag, str(v)]
        if args.best:
            cmd.append("--best")
        sys.stdout.flush()
        r = subprocess.run(cmd)
        if r.returncode != 0:
            sys.exit(r.returncode)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--bench", action="store_true", help="synthetic samples/s benchmark")
    mode.add_argument("--fashion-mnist", action="store_true", help="train on Fashion-MNIST")
    p.add_argument("--threads", type=int, default=default_threads(),
                   help="torch.set_num_threads (default LOOM_NUM_THREADS, else all cores)")
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="sgd")
    p.add_argument("--lr", type=float)
    p.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant")
    p.add_argument("--momentum", type=float)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--amp", choices=["none", "bf16"], default="none",
                   help="mixed precision: torch.autocast('cpu', dtype=torch.bfloat16) around the "
                        "forward and the loss (PyTorch 1.13's CPU autocast has no f16, and bf16 "
                        "needs no GradScaler)")
    p.add_argument("--no-shuffle", action="store_true")
    p.add_argument("--init", metavar="FILE.safetensors")
    p.add_argument("--save", metavar="FILE.safetensors")
    p.add_argument("--limit-steps", type=int, default=0)
    p.add_argument("--log-every", type=int, default=0,
                   help="print step=<n> loss=<value> when n %% N == 0 (n from 0, the loss "
                        "before that batch's update)")
    p.add_argument("--json", action="store_true", help="(accepted for symmetry: the result "
                   "is always one JSON line)")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    p.add_argument("--config", help="bench: comma-separated configurations among " +
                   ",".join(CONFIGS) + " (default " + ",".join(DEFAULT_CONFIGS) + ")")
    p.add_argument("--runs", type=int, default=7, help="bench: timed runs (median)")
    p.add_argument("--steps", type=int, default=20, help="bench: steps per timed run")
    p.add_argument("--warmup", type=int, default=20, help="bench: untimed steps after the first")
    p.add_argument("--best", action="store_true", help="bench: best run instead of the median")
    p.add_argument("--world-size", type=int, default=1,
                   help="bench: DistributedDataParallel (gloo) over this many local processes "
                        "of --threads threads each, sharing each configuration's batch")
    p.add_argument("--bench-one", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.batch_size < 1 or args.epochs < 0 or args.threads < 1 or args.world_size < 1:
        p.error("--batch-size, --threads and --world-size must be >= 1, --epochs >= 0")
    if args.world_size > 1 and not args.bench:
        p.error("--world-size applies to --bench only")
    torch.set_num_threads(args.threads)
    try:
        if args.bench:
            run_bench(args)
        else:
            train_fashion_mnist(args)
    except (OSError, ValueError) as e:  # missing/corrupt data or --init file: no traceback
        sys.exit(f"torch_train.py: {e}")


if __name__ == "__main__":
    main()
