#!/usr/bin/python3
"""GPT-2 in PyTorch against examples/gpt2: the same model (nanoGPT's: pre-LayerNorm blocks,
causal self-attention, tanh GELU, lm_head tied to wte), from the same init file (a nanoGPT
state_dict in safetensors, as `gpt2 --save` writes), on the same batches of the same token
file, with the same AdamW (weight decay on the 2-D weights only, betas 0.9/0.95), warm-up,
schedule and gradient clipping; runs Loom's example with --json and compares every step's
loss with PyTorch's in float32 and float64, then the tokens/s of each.

  OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/torch_gpt2.py --text README.md \\
      --n-layer 4 --n-head 4 --n-embd 128 --block-size 128 --seq-len 64 --batch-size 8

Needs python3-torch and python3-numpy (Debian), and OpenBLAS (libopenblas-dev, as
`scripts/setup.sh --bench` installs): without it Debian's torch multiplies on the reference
BLAS, ~30x slower. A benchmark, not a test: CI does not run it.
Without --init, Loom writes the initial weights first (`--max-steps 1 --lr 0 --save`).
"""
import argparse
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def load_safetensors(path):
    raw = open(path, 'rb').read()
    n = struct.unpack('<Q', raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    dt = {'F32': np.float32, 'F64': np.float64, 'F16': np.float16}
    out = {}
    for k, v in head.items():
        if k == '__metadata__':
            continue
        b, e = v['data_offsets']
        a = np.frombuffer(raw[8 + n + b:8 + n + e], dtype=dt[v['dtype']])
        out[k] = a.reshape(v['shape']).astype(np.float64)
    return out


def load_tokens(args):
    if args.text:
        return np.frombuffer(open(args.text, 'rb').read(), dtype=np.uint8).astype(np.int64)
    raw = open(args.data, 'rb').read()
    h = struct.unpack('<256i', raw[:1024])
    assert h[0] == 20240520 and h[1] == 1, 'not an llm.c token file'
    return np.frombuffer(raw[1024:1024 + 2 * h[2]], dtype=np.uint16).astype(np.int64)


def batch(tok, k, B, T):
    """examples/gpt2_data.c's batch k in order: tokens[k*B*T : (k+1)*B*T + 1], wrapping."""
    n = len(tok)
    start = (k * B * T + np.arange(B)[:, None] * T + np.arange(T)[None, :]) % n
    return tok[start], tok[(start + 1) % n]


class GPT2(torch.nn.Module):
    def __init__(self, sd, n_head, dtype):
        super().__init__()
        self.n_head = n_head
        self.p = torch.nn.ParameterDict()
        for k, v in sd.items():
            if k == 'lm_head.weight' or k.endswith('.attn.bias'):
                continue  # tied to wte; nanoGPT's mask buffer
            self.p[k.replace('.', '__')] = torch.nn.Parameter(torch.tensor(v, dtype=dtype))
        self.n_layer = 1 + max(int(k.split('.')[2]) for k in sd if k.startswith('transformer.h.'))

    def w(self, name):
        return self.p[name.replace('.', '__')]

    def forward(self, idx):
        B, T = idx.shape
        wte = self.w('transformer.wte.weight')
        C = wte.shape[1]
        H = self.n_head
        x = F.embedding(idx, wte) + self.w('transformer.wpe.weight')[:T]
        for l in range(self.n_layer):
            g = lambda s: self.w('transformer.h.%d.%s' % (l, s))
            h = F.layer_norm(x, (C,), g('ln_1.weight'), g('ln_1.bias'), 1e-5)
            q, k, v = F.linear(h, g('attn.c_attn.weight'), g('attn.c_attn.bias')).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            # Debian's torch 1.13 lacks F.scaled_dot_product_attention: nanoGPT's slow path
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            y = F.softmax(att.masked_fill(~mask, float('-inf')), dim=-1) @ v
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            x = x + F.linear(y, g('attn.c_proj.weight'), g('attn.c_proj.bias'))
            h = F.layer_norm(x, (C,), g('ln_2.weight'), g('ln_2.bias'), 1e-5)
            h = F.gelu(F.linear(h, g('mlp.c_fc.weight'), g('mlp.c_fc.bias')), approximate='tanh')
            x = x + F.linear(h, g('mlp.c_proj.weight'), g('mlp.c_proj.bias'))
        x = F.layer_norm(x, (C,), self.w('transformer.ln_f.weight'),
                         self.w('transformer.ln_f.bias'), 1e-5)
        return F.linear(x, wte)


def lr_at(args, step):
    """examples/gpt2.c's lr_at (nanoGPT's get_lr with min_lr = lr / 10 at the last step)."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    if args.lr_schedule != 'cosine':
        return args.lr
    span = args.steps - 1 - args.warmup_steps
    ratio = (step - args.warmup_steps) / span if span > 0 else 1.0
    return 0.1 * args.lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (args.lr - 0.1 * args.lr)


def train_torch(args, sd, tok, dtype):
    torch.manual_seed(0)
    m = GPT2(sd, args.n_head, dtype)
    params = list(m.p.values())
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{'params': decay, 'weight_decay': args.weight_decay},
                             {'params': other, 'weight_decay': 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    losses, times = [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g['lr'] = lr_at(args, step)
        x, y = batch(tok, step, args.batch_size, args.seq_len)
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        logits = m(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        opt.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    med = statistics.median(times[2:]) if len(times) > 2 else times[-1]
    return losses, args.batch_size * args.seq_len / med


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--loom', default=os.path.join(HERE, '..', 'build', 'examples', 'gpt2'))
    ap.add_argument('--init', help='nanoGPT safetensors (default: Loom writes its initial weights)')
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument('--text')
    src.add_argument('--data')
    for name, default in (('n-layer', 2), ('n-head', 2), ('n-embd', 64), ('block-size', 64),
                          ('seq-len', 32), ('batch-size', 4), ('steps', 30), ('warmup-steps', 0),
                          ('seed', 0)):
        ap.add_argument('--' + name, type=int, default=default)
    ap.add_argument('--vocab-size', type=int, default=0, help='default 256 with --text, else 50257')
    ap.add_argument('--lr', type=float, default=6e-4)
    ap.add_argument('--weight-decay', type=float, default=0.1)
    ap.add_argument('--grad-clip', type=float, default=1.0)
    ap.add_argument('--lr-schedule', choices=('constant', 'cosine'), default='constant')
    ap.add_argument('--threads', type=int, default=0, help='torch threads (default: all cores)')
    ap.add_argument('--dtypes', default='float32,float64')
    args = ap.parse_args()
    # Debian's torch starts with one OpenMP thread here (omp_get_max_threads() 1): use the
    # cores Loom's device uses.
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    data = ['--text', args.text] if args.text else ['--data', args.data]
    common = data + ['--n-head', str(args.n_head), '--seq-len', str(args.seq_len),
                     '--batch-size', str(args.batch_size)]
    tmp = tempfile.mkdtemp(prefix='torch-gpt2-')
    init = args.init
    if not init:
        init = os.path.join(tmp, 'init.safetensors')
        sizes = ['--n-layer', str(args.n_layer), '--n-embd', str(args.n_embd),
                 '--block-size', str(args.block_size), '--seed', str(args.seed)]
        if args.vocab_size:
            sizes += ['--vocab-size', str(args.vocab_size)]
        subprocess.run([args.loom] + common + sizes + ['--max-steps', '1', '--lr', '0', '--save',
                                                       init, '--json'],
                       check=True, stdout=subprocess.DEVNULL)
    sd = load_safetensors(init)
    tok = load_tokens(args)
    run = subprocess.run([args.loom] + common + [
        '--init', init, '--max-steps', str(args.steps), '--lr', repr(args.lr),
        '--weight-decay', repr(args.weight_decay), '--grad-clip', repr(args.grad_clip),
        '--warmup-steps', str(args.warmup_steps), '--lr-schedule', args.lr_schedule, '--json'],
                         check=True, stdout=subprocess.PIPE, text=True)
    res = json.loads([l for l in run.stdout.splitlines() if l.startswith('{')][-1])
    loom = res['losses']
    print('model: %d layers, %d heads, n_embd %d, vocab %d, %d parameters; batch %d x %d, '
          '%d steps; torch threads %d' % (res['n_layer'], res['n_head'], res['n_embd'],
                                          res['vocab_size'], res['n_params'], args.batch_size,
                                          args.seq_len, args.steps, torch.get_num_threads()))
    rates = {'loom': res['tokens_per_sec_median']}
    cols = {}
    for name in args.dtypes.split(','):
        cols[name], rates['torch ' + name] = train_torch(args, sd, tok, getattr(torch, name))
    print('step  %-12s' % 'loom' + ''.join('  %-12s %-9s' % ('torch ' + n, 'diff') for n in cols))
    for i, l in enumerate(loom):
        print('%4d  %-12.7f' % (i, l) +
              ''.join('  %-12.7f %-9.2e' % (c[i], abs(c[i] - l)) for c in cols.values()))
    for n, c in cols.items():
        d = [abs(a - b) for a, b in zip(loom, c)]
        print('max |loom - torch %s| = %.3g (first step %.3g, relative %.3g)' %
              (n, max(d), d[0], max(x / abs(b) for x, b in zip(d, c))))
    for k, v in rates.items():
        print('%-15s %10.0f tokens/s (median after 2 steps)' % (k, v))
    print('loom MFU %.4f of a measured f32 GEMM peak of %.1f GFLOP/s' %
          (res['mfu'], res['peak_flops'] / 1e9))


if __name__ == '__main__':
    sys.exit(main())
