"""Table helpers of the bench/run_*.sh scripts: JSON-lines results in, one aligned text or
Markdown table out."""
import json
from statistics import median


def load_jsonl(path):
    """The JSON objects of a file of one object per line (blank lines skipped)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def print_table(head, rows, markdown=False):
    """head: column titles; rows: lists of strings. The first column is left-aligned."""
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---" if i == 0 else "--:" for i in range(len(head))) + "|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
        return
    w = [max(len(head[i]), *(len(r[i]) for r in rows)) for i in range(len(head))]
    print("  ".join(h.rjust(w[i]) if i else h.ljust(w[i]) for i, h in enumerate(head)))
    for r in rows:
        print("  ".join(c.rjust(w[i]) if i else c.ljust(w[i]) for i, c in enumerate(r)))


def resnet_table(loom_path, torch_path, markdown=False, cpu="?"):
    """run_train_bench.sh --resnet's table: examples/resnet's JSON lines (with config, threads
    and round added) against torch_train.py --bench's (with round), matched by (config, amp).
    With several rounds each side's cell lists its rounds' samples/s in order; the ratio is
    of the two medians, and the per-round ratios (same round) give its spread."""
    def by_key(path):
        out = {}
        for r in load_jsonl(path):
            out.setdefault((r["config"], r["amp"]), []).append(r)
        return out

    loom, torch = by_key(loom_path), by_key(torch_path)
    rounds = max((len(v) for v in loom.values()), default=1)
    head = ["config", "amp", "threads", "Loom samples/s", "PyTorch samples/s", "ratio"]
    if rounds > 1:
        head.append("ratio per round")
    head += ["goal", "Loom 1st step ms (compile)", "PyTorch 1st step ms", "Loom planned peak MB",
             "Loom peak device MB", "PyTorch RSS MB (training)"]
    rows = []
    for key, ls in loom.items():
        ts = torch.get(key)
        if not ts:
            continue
        lv = [r["samples_per_sec_median"] for r in ls]
        tv = [r["samples_per_sec"] for r in ts]
        ratio = median(lv) / median(tv) if median(tv) else 0.0
        row = [key[0], key[1], str(ls[0]["threads"]), " / ".join(f"{v:.1f}" for v in lv),
               " / ".join(f"{v:.1f}" for v in tv), f"{ratio:.2f}x"]
        if rounds > 1:
            tr = {r.get("round"): r["samples_per_sec"] for r in ts}
            per = [r["samples_per_sec_median"] / tr[r.get("round")] for r in ls
                   if tr.get(r.get("round"))]
            row.append(f"{min(per):.2f}-{max(per):.2f}x" if per else "-")
        row += [f'>= 1.5x {"met" if ratio >= 1.5 else "NOT met"}',
                f'{median([r["first_step_ms"] for r in ls]):.0f} '
                f'({median([r["compile_time_ms"] for r in ls]):.0f})',
                f'{median([r["first_step_ms"] for r in ts]):.0f}',
                f'{max(r["planned_peak_bytes"] for r in ls) / 1e6:.0f}',
                f'{max(r["peak_device_memory_bytes"] for r in ls) / 1e6:.0f}',
                f'{max(r["peak_rss_bytes"] for r in ts) / 1e6:.0f} '
                f'({max(r["train_rss_bytes"] for r in ts) / 1e6:.0f})']
        rows.append(row)
    print_table(head, rows, markdown)
    version = next(iter(torch.values()), [{}])[0].get("torch_version", "?")
    spread = (f" {rounds} rounds, the sides taking turns to go first; a cell lists its rounds, "
              f"the ratio is of the medians, first steps are medians." if rounds > 1 else "")
    print(f"\nCPU: {cpu}. ResNet-50 (1000 classes), SGD lr 0.01 momentum 0.9 weight decay 1e-4. "
          f"Loom: examples/resnet, the median step after 2 warm-up steps; PyTorch {version} "
          f"eager CPU (torchvision), the median of timed runs after warm-up.{spread} "
          f"\"training\" RSS is the peak RSS less the RSS before the model was built.")


def conv_table(loom_path, torch_path, markdown=False, cpu="?"):
    """run_conv_bench.sh's table: bench_conv --json against torch_conv.py --json, matched by
    (dtype, layer, pass), in Loom's order; ratio = PyTorch ms / Loom ms (> 1: Loom faster).
    When every layer of a dtype ran, a total per pass weights each layer by its uses (the
    network's 53 convolutions)."""
    shape_keys = ["batch", "threads", "c", "o", "h", "k", "stride", "pad"]
    torch = {(r["dtype"], r["layer"], r["pass"]): r for r in load_jsonl(torch_path)}
    head = ["layer", "dtype", "pass", "Loom ms", "PyTorch ms", "Loom GFLOP/s",
            "PyTorch GFLOP/s", "ratio", "Loom kernels"]
    rows, totals, missing = [], {}, []
    for l in load_jsonl(loom_path):
        key = (l["dtype"], l["layer"], l["pass"])
        t = torch.get(key)
        if t is None:
            missing.append(" ".join(key))
            continue
        differ = [k for k in shape_keys if l[k] != t[k]]
        if differ:
            raise SystemExit(f"bench_table.py: {' '.join(key)}: the two sides ran different "
                             f"convolutions ({', '.join(differ)} differ): keep LAYERS in "
                             f"torch_conv.py in step with layers[] in bench_conv.c")
        rows.append([l["layer"], l["dtype"], l["pass"], f'{l["ms"]:.3f}', f'{t["ms"]:.3f}',
                     f'{l["gflops"]:.0f}', f'{t["gflops"]:.0f}', f'{t["ms"] / l["ms"]:.2f}x',
                     str(l["kernels"])])
        tot = totals.setdefault((l["dtype"], l["pass"]), [0, 0.0, 0.0, 0.0])
        tot[0] += l["uses"]
        tot[1] += l["uses"] * l["ms"]
        tot[2] += l["uses"] * t["ms"]
        tot[3] += l["uses"] * l["flops"]
    total_note = ""
    for (dtype, pas), (uses, lms, tms, flops) in totals.items():
        if uses == 53:  # every layer: the whole network's convolutions
            total_note = (" ResNet-50 (53 convs): each layer's ms times its uses in the "
                          "network, summed.")
            rows.append(["ResNet-50 (53 convs)", dtype, pas, f"{lms:.3f}", f"{tms:.3f}",
                         f"{flops / (lms * 1e-3) / 1e9:.0f}", f"{flops / (tms * 1e-3) / 1e9:.0f}",
                         f"{tms / lms:.2f}x", "-"])
    any_l = next(iter(load_jsonl(loom_path)), {})
    any_t = next(iter(torch.values()), {})
    image = any_l.get("image_size", 224)
    print(f"ResNet-50 convolutions (torchvision v1.5, {image}x{image}), "
          f"batch {any_l.get('batch', '?')}, "
          f"{any_l.get('threads', '?')} threads on both sides; CPU: {cpu}")
    print_table(head, rows, markdown)
    bf16 = " bf16: both sides on bf16 tensors (PyTorch: the oneDNN kernels autocast reaches, " \
           "without autocast's casts)." if any(r[1] == "bf16" for r in rows) else ""
    print(f"\nms: Loom's {any_l.get('stat', 'median')} step ExecuteTime (one compiled step per "
          f"pass, compiled once), PyTorch {any_t.get('torch_version', '?')}'s "
          f"{any_t.get('stat', 'median')} call (conv backend {any_t.get('backend', '?')}); "
          f"GFLOP/s = 2*N*O*OH*OW*C*KH*KW / time; ratio = PyTorch ms / Loom ms (> 1: Loom "
          f"faster); Loom kernels: kernels in its compiled step.{total_note}{bf16}")
    if missing:
        print("no PyTorch result for: " + ", ".join(missing))


if __name__ == "__main__":
    # bench_table.py resnet|conv LOOM.jsonl TORCH.jsonl MARKDOWN(0|1) [CPU NAME]
    import sys
    sys.dont_write_bytecode = True
    if len(sys.argv) in (5, 6) and sys.argv[1] == "resnet":
        resnet_table(sys.argv[2], sys.argv[3], sys.argv[4] == "1",
                     sys.argv[5] if len(sys.argv) == 6 else "?")
    elif len(sys.argv) in (5, 6) and sys.argv[1] == "conv":
        conv_table(sys.argv[2], sys.argv[3], sys.argv[4] == "1",
                   sys.argv[5] if len(sys.argv) == 6 else "?")
    else:
        sys.exit("usage: bench_table.py resnet|conv LOOM.jsonl TORCH.jsonl 0|1 [CPU NAME]")
