"""Table helpers of the bench/run_*.sh scripts: JSON-lines results in, one aligned text or
Markdown table out."""
import json


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


def resnet_table(loom_path, torch_path, markdown=False):
    """run_train_bench.sh --resnet's table: examples/resnet's JSON lines (with config and
    threads added) against torch_train.py --bench's, matched by (config, amp)."""
    loom = {(r["config"], r["amp"]): r for r in load_jsonl(loom_path)}
    torch = {(r["config"], r["amp"]): r for r in load_jsonl(torch_path)}
    head = ["config", "amp", "threads", "Loom samples/s", "PyTorch samples/s", "ratio", "goal",
            "Loom 1st step ms (compile)", "PyTorch 1st step ms", "Loom planned peak MB",
            "Loom peak device MB", "PyTorch RSS MB (training)"]
    rows = []
    for key, l in loom.items():
        t = torch.get(key)
        if t is None:
            continue
        ratio = l["samples_per_sec_median"] / t["samples_per_sec"] if t["samples_per_sec"] else 0
        rows.append([key[0], key[1], str(l["threads"]), f'{l["samples_per_sec_median"]:.1f}',
                     f'{t["samples_per_sec"]:.1f}', f"{ratio:.2f}x",
                     f'>= 1.5x {"met" if ratio >= 1.5 else "NOT met"}',
                     f'{l["first_step_ms"]:.0f} ({l["compile_time_ms"]:.0f})',
                     f'{t["first_step_ms"]:.0f}', f'{l["planned_peak_bytes"] / 1e6:.0f}',
                     f'{l["peak_device_memory_bytes"] / 1e6:.0f}',
                     f'{t["peak_rss_bytes"] / 1e6:.0f} ({t["train_rss_bytes"] / 1e6:.0f})'])
    print_table(head, rows, markdown)
    version = next(iter(torch.values()), {}).get("torch_version", "?")
    print(f"\nResNet-50 (1000 classes), SGD lr 0.01 momentum 0.9 weight decay 1e-4. Loom: "
          f"examples/resnet, the median step after 2 warm-up steps; PyTorch {version} eager "
          f"CPU (torchvision), the median of timed runs after warm-up. \"training\" RSS is the "
          f"peak RSS less the RSS before the model was built.")


if __name__ == "__main__":  # bench_table.py resnet LOOM.jsonl TORCH.jsonl MARKDOWN(0|1)
    import sys
    sys.dont_write_bytecode = True
    if len(sys.argv) != 5 or sys.argv[1] != "resnet":
        sys.exit("usage: bench_table.py resnet LOOM.jsonl TORCH.jsonl 0|1")
    resnet_table(sys.argv[2], sys.argv[3], sys.argv[4] == "1")
