#!/usr/bin/python3
"""GPT-2 in PyTorch against examples/gpt2: the same model (nanoGPT's: pre-LayerNorm blocks,
causal self-attention, tanh GELU, lm_head tied to wte), from the same init file (a nanoGPT
state_dict in safetensors, as `gpt2 --save` writes), on the same batches of the same token
file, with the same AdamW (weight decay on the 2-D weights only, betas 0.9/0.95), warm-up,
schedule and gradient clipping; runs Loom's example with --json and compares every step's
loss with PyTorch's in each of --dtypes, then the tokens/s, first steps and memory of each,
and ends with a summary table (markdown with --markdown).

  OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/torch_gpt2.py --text README.md \\
      --n-layer 4 --n-head 4 --n-embd 128 --block-size 128 --seq-len 64 --batch-size 8 \\
      --dtypes float32,bfloat16,float64 --markdown

--dtypes lists PyTorch's runs: float32 and float64 train parameters of that dtype; bfloat16
trains f32 parameters under torch.autocast('cpu', dtype=torch.bfloat16), as AMP does, and
adds a Loom run with `--amp bf16` (Loom's fp32 run is always made). Every dtype's loss gap is
also given against the most precise PyTorch run (float64 when listed, else float32), so that
Loom's bf16 gap reads against PyTorch's own bf16 gap.

First step: each Loom run is made twice, cold (a fresh, empty LOOM_CACHE_DIR) and then warm
(the same folder: the compiled code loads from disk); --no-warm skips the warm run. Both
runs' first_step_ms (tracing, compiling or loading, launching: steps run asynchronously),
compile_time_ms and first_loss_ms (until step 0's loss was read: its run too, as in
PyTorch's first step, and step 1's tracing) are shown beside PyTorch's first step.

Memory: Loom's planned peak of the training step and its device's peak (both from --json)
beside PyTorch's training RSS growth. Each PyTorch dtype trains in a fresh process of this
script (the allocator keeps no memory freed by another run), which, once torch is imported
and the init and tokens are loaded, resets the peak RSS (`echo 5 > /proc/self/clear_refs`),
reads VmRSS, builds the model, trains, and takes VmHWM minus that VmRSS: parameters,
gradients, AdamW state, activations and allocator slack. Where clear_refs is refused, the
largest VmRSS seen between steps stands in (missing the peaks inside a step); the output
names which was used.

Needs python3-torch and python3-numpy (Debian), and OpenBLAS (libopenblas-dev, as
`scripts/setup.sh --bench` installs): without it Debian's torch multiplies on the reference
BLAS, ~30x slower. A benchmark, not a test: CI does not run it.
Without --init, Loom writes the initial weights first (`--max-steps 1 --lr 0 --save`, with
the disk cache off, so that the cold run finds nothing compiled).
"""
import argparse
import gc
import json
import math
import os
import shutil
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
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def status_mib(field):
    """VmRSS, VmHWM, ... of this process (/proc/self/status), in MiB."""
    for line in open('/proc/self/status'):
        if line.startswith(field + ':'):
            return int(line.split()[1]) / 1024.0
    raise KeyError(field)


def reset_peak_rss():
    """Resets VmHWM to the current VmRSS (Linux 4.0+); False where that is refused."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
    except OSError:
        return False
    return status_mib('VmHWM') <= status_mib('VmRSS') + 1


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


def train_torch(args, sd, tok, name):
    """Trains PyTorch's model in dtype `name` (bfloat16: f32 parameters under CPU autocast).
    Returns the losses, the median tokens/s after 2 steps, every step's seconds and the
    largest VmRSS seen after a step (MiB)."""
    amp = name == 'bfloat16'
    torch.manual_seed(0)
    m = GPT2(sd, args.n_head, torch.float32 if amp else getattr(torch, name))
    params = list(m.p.values())
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{'params': decay, 'weight_decay': args.weight_decay},
                             {'params': other, 'weight_decay': 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    losses, times, rss = [], [], 0.0
    for step in range(args.steps):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g['lr'] = lr_at(args, step)
        x, y = batch(tok, step, args.batch_size, args.seq_len)
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        # As Loom's example: the forward and the loss autocast, the backward outside.
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=amp):
            logits = m(x)
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        opt.step()
        losses.append(loss.float().item())
        times.append(time.perf_counter() - t0)
        rss = max(rss, status_mib('VmRSS'))
    med = statistics.median(times[2:]) if len(times) > 2 else times[-1]
    return losses, args.batch_size * args.seq_len / med, times, rss


def torch_worker(args):
    """--worker NAME: one PyTorch training in a fresh process, so that the peak RSS is its
    own; prints one JSON line."""
    sd = load_safetensors(args.init)
    tok = load_tokens(args)
    gc.collect()
    hwm = reset_peak_rss()
    base = status_mib('VmRSS')
    losses, rate, times, seen = train_torch(args, sd, tok, args.worker)
    peak = status_mib('VmHWM') if hwm else seen
    print(json.dumps({'dtype': args.worker, 'losses': losses, 'tokens_per_sec': rate,
                      'first_step_ms': times[0] * 1e3, 'rss_base_mb': base, 'rss_peak_mb': peak,
                      'rss_growth_mb': peak - base,
                      'rss_method': 'VmHWM' if hwm else 'largest VmRSS between steps'}))


def last_json(stdout):
    return json.loads([l for l in stdout.splitlines() if l.startswith('{')][-1])


def run_torch(init, name):
    """torch_worker for dtype `name` in a fresh process of this script: its result."""
    argv = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:] + [
        '--init', init, '--worker', name]
    return last_json(subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True).stdout)


def run_loom(args, argv, cache_dir):
    """Loom's example with LOOM_CACHE_DIR = cache_dir: its --json result."""
    env = dict(os.environ, LOOM_CACHE_DIR=cache_dir)
    return last_json(subprocess.run([args.loom] + argv, check=True, stdout=subprocess.PIPE,
                                    text=True, env=env).stdout)


def max_diff(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


def print_table(header, rows, markdown):
    """The first two columns are text (left-aligned), the others figures."""
    if markdown:
        print('| ' + ' | '.join(header) + ' |')
        print('|' + '|'.join('---' if i < 2 else '--:' for i in range(len(header))) + '|')
        for r in rows:
            print('| ' + ' | '.join(r) + ' |')
        return
    w = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    for r in [header] + rows:
        print('  '.join(c.ljust(w[i]) if i < 2 else c.rjust(w[i]) for i, c in enumerate(r)))


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
    ap.add_argument('--dtypes', default='float32,float64',
                    help='PyTorch runs among float32, float64, bfloat16 (autocast; adds Loom '
                         '--amp bf16)')
    ap.add_argument('--no-warm', action='store_true',
                    help='skip the second (warm-cache) run of each Loom configuration')
    ap.add_argument('--markdown', action='store_true', help='the summary table in markdown')
    ap.add_argument('--worker', help=argparse.SUPPRESS)  # one PyTorch run (torch_worker)
    args = ap.parse_args()
    # Debian's torch starts with one OpenMP thread here (omp_get_max_threads() 1): use the
    # cores Loom's device uses.
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    if args.worker:
        return torch_worker(args)
    tmp = tempfile.mkdtemp(prefix='torch-gpt2-')  # the init file and the Loom caches
    try:
        compare(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def compare(args, tmp):
    data = ['--text', args.text] if args.text else ['--data', args.data]
    common = data + ['--n-head', str(args.n_head), '--seq-len', str(args.seq_len),
                     '--batch-size', str(args.batch_size)]
    init = args.init
    if not init:
        init = os.path.join(tmp, 'init.safetensors')
        sizes = ['--n-layer', str(args.n_layer), '--n-embd', str(args.n_embd),
                 '--block-size', str(args.block_size), '--seed', str(args.seed)]
        if args.vocab_size:
            sizes += ['--vocab-size', str(args.vocab_size)]
        subprocess.run([args.loom] + common + sizes + ['--max-steps', '1', '--lr', '0', '--save',
                                                       init, '--json'],
                       check=True, stdout=subprocess.DEVNULL,
                       env=dict(os.environ, LOOM_CACHE_DIR=''))  # "": no disk cache
    dtypes = args.dtypes.split(',')
    train = ['--init', init, '--max-steps', str(args.steps), '--lr', repr(args.lr),
             '--weight-decay', repr(args.weight_decay), '--grad-clip', repr(args.grad_clip),
             '--warmup-steps', str(args.warmup_steps), '--lr-schedule', args.lr_schedule, '--json']
    looms = {}  # Loom's dtype -> (cold run's result, warm run's or None)
    for name, amp in (('float32', 'none'), ('bfloat16', 'bf16')):
        if name == 'float32' or name in dtypes:
            cache = tempfile.mkdtemp(prefix='cache-%s-' % name, dir=tmp)
            argv = common + train + ['--amp', amp]
            cold = run_loom(args, argv, cache)
            looms[name] = (cold, None if args.no_warm else run_loom(args, argv, cache))
    cols = {name: run_torch(init, name) for name in dtypes}
    res = looms['float32'][0]
    print('model: %d layers, %d heads, n_embd %d, vocab %d, %d parameters; batch %d x %d, '
          '%d steps; torch threads %d' % (res['n_layer'], res['n_head'], res['n_embd'],
                                          res['vocab_size'], res['n_params'], args.batch_size,
                                          args.seq_len, args.steps, torch.get_num_threads()))
    for ln, (lr, _) in looms.items():
        loom = lr['losses']
        print('step  %-12s' % ('loom' if ln == 'float32' else 'loom ' + ln) +
              ''.join('  %-12s %-9s' % ('torch ' + n, 'diff') for n in cols))
        for i, l in enumerate(loom):
            print('%4d  %-12.7f' % (i, l) + ''.join('  %-12.7f %-9.2e' % (
                c['losses'][i], abs(c['losses'][i] - l)) for c in cols.values()))
        for n, c in cols.items():
            d = [abs(a - b) for a, b in zip(loom, c['losses'])]
            print('max |loom %s - torch %s| = %.3g (first step %.3g, relative %.3g)' %
                  (ln, n, max(d), d[0], max(x / abs(b) for x, b in zip(d, c['losses']))))
    ref = 'float64' if 'float64' in cols else 'float32' if 'float32' in cols else None
    for n, c in cols.items():
        if ref and n != ref:
            print('max |torch %s - torch %s| = %.3g (PyTorch\'s own %s gap)' %
                  (n, ref, max_diff(c['losses'], cols[ref]['losses']), n))
    for ln, (cold, warm) in looms.items():
        print('%-15s %10.0f tokens/s (median after 2 steps)' %
              ('loom ' + ln, cold['tokens_per_sec_median']))
        if warm and warm['losses'] != cold['losses']:
            print('  the warm run\'s losses differ from the cold run\'s by up to %.3g' %
                  max_diff(warm['losses'], cold['losses']))
    for n, c in cols.items():
        print('%-15s %10.0f tokens/s (median after 2 steps)' % ('torch ' + n, c['tokens_per_sec']))
    for ln, (cold, warm) in looms.items():
        step = lambda r: '%.0f ms (compile %.0f ms; its loss after %.0f ms)' % (
            r['first_step_ms'], r['compile_time_ms'], r.get('first_loss_ms', float('nan')))
        print('loom %s first step: cold %s' % (ln, step(cold)) +
              (', warm %s' % step(warm) if warm else ''))
    for n, c in cols.items():
        print('torch %s first step: %.0f ms' % (n, c['first_step_ms']))
    for ln, (cold, _) in looms.items():
        print('loom %s memory: planned peak %.1f MiB for the training step, device peak %.1f MiB'
              % (ln, cold['planned_peak_mb'], cold['device_peak_mb']))
    for n, c in cols.items():
        print('torch %s training RSS growth: %.1f MiB (%.1f -> %.1f MiB, %s)' %
              (n, c['rss_growth_mb'], c['rss_base_mb'], c['rss_peak_mb'], c['rss_method']))
    print('loom MFU %.4f of a measured %s GEMM peak of %.1f GFLOP/s' %
          (res['mfu'], res.get('peak_dtype', 'f32'), res['peak_flops'] / 1e9))

    model = '%d layers, C %d, V %d, T %d, B %d' % (res['n_layer'], res['n_embd'],
                                                  res['vocab_size'], args.seq_len, args.batch_size)
    sci = lambda v: '%.1e' % v
    header = ['model', 'dtype', 'Loom tokens/s', 'PyTorch tokens/s', 'Loom / PyTorch',
              'Loom first step cold / warm ms', 'Loom compile cold / warm ms',
              'Loom first loss cold / warm ms', 'PyTorch first step ms', 'Loom planned / device peak MiB', 'PyTorch RSS growth MiB',
              'planned / RSS growth', 'max loss diff vs PyTorch f32', 'vs PyTorch f64',
              'PyTorch same dtype vs %s' % {'float64': 'f64', 'float32': 'f32'}.get(ref, '-')]
    rows = []
    for ln, (cold, warm) in looms.items():
        c = cols.get(ln)  # PyTorch in the same dtype
        rate = cold['tokens_per_sec_median']
        pair = lambda k: '%.0f / %s' % (cold.get(k, float('nan')),
                                        '%.0f' % warm.get(k, float('nan')) if warm else '-')
        vs = lambda n, r: sci(max_diff(r['losses'], cols[n]['losses'])) if n in cols else 'not run'
        rows.append([
            model, ln + (' (autocast)' if ln == 'bfloat16' else ''), '%.0f' % rate,
            '%.0f' % c['tokens_per_sec'] if c else 'not run',
            '%.2fx' % (rate / c['tokens_per_sec']) if c else '-',
            pair('first_step_ms'), pair('compile_time_ms'), pair('first_loss_ms'),
            '%.0f' % c['first_step_ms'] if c else '-',
            '%.1f / %.1f' % (cold['planned_peak_mb'], cold['device_peak_mb']),
            '%.1f' % c['rss_growth_mb'] if c else '-',
            '%.2fx' % (cold['planned_peak_mb'] / c['rss_growth_mb'])
            if c and c['rss_growth_mb'] > 0 else '-',
            vs('float32', cold), vs('float64', cold),
            vs(ref, c) if c and ref and ln != ref else '-'])
    print('\nover %d steps, PyTorch on %d threads (OpenBLAS core %s):' %
          (args.steps, torch.get_num_threads(), OPENBLAS_CORE or 'unknown'))
    print_table(header, rows, args.markdown)


if __name__ == '__main__':
    sys.exit(main())
