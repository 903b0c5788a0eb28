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
