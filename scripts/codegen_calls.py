#!/usr/bin/env python3
"""File-level call graph of a folder's C files (python3 stdlib only).

For each .c file: the non-static functions it defines, and for every other .c file of the
folder whose functions it uses (calls, or takes the address of), which ones. Static inline
functions of the folder's headers count as used by the files that use them. Then the
arrows (ordered file pairs A -> B where A uses a function defined in B) and the cycles
(strongly connected components of more than one file).

usage: codegen_calls.py [--dir codegen] [--nm OBJDIR] [--quiet] [--fail-on-cycle]
  --nm OBJDIR: also cross-check against the objects' symbols (nm -g on OBJDIR/*.o)
  --fail-on-cycle: exit 1 when there is a cycle (the 'codegen_acyclic' test: codegen's kind
                   files call down into helpers that call none of them, issue 50)
"""
import argparse
import os
import re
import subprocess
import sys

TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.]*|\S")
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "do", "else", "case",
            "_Static_assert", "static_assert", "defined", "__attribute__", "_Alignof"}


def strip(text):
    """Comments and string/char literals blanked out; #include/#if... lines dropped, #define
    bodies kept (a macro's references count as the file's)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(" " if "\n" not in text[i:j] else "\n" * text[i:j].count("\n"))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" 0 ")
            i = j + 1
        else:
            out.append(c)
            i += 1
    lines = []
    for line in "".join(out).split("\n"):
        s = line.lstrip()
        if s.startswith("#"):
            m = re.match(r"#\s*define\s+\w+(\([^)]*\))?(.*)", s)
            lines.append("#MACRO " + m.group(2) if m else "")
        else:
            lines.append(line)
    return "\n".join(lines)


def scan(text):
    """(definitions, references): definitions as [(name, is_static, body_refs)], references
    as the identifiers used inside bodies/initializers and macro bodies."""
    defs, refs = [], set()
    toks = []
    for line in strip(text).split("\n"):
        if line.startswith("#MACRO "):
            refs.update(t for t in TOKEN.findall(line[7:]) if t[0].isalpha() or t[0] == "_")
        else:
            toks.extend(TOKEN.findall(line))
    depth, decl, cur = 0, [], None
    for t in toks:
        if depth == 0:
            if t == "{":
                # a function definition: `... name ( ... ) {`
                name = None
                if ")" in decl and "(" in decl and "=" not in decl:
                    k = decl.index("(")
                    if k > 0 and re.match(r"[A-Za-z_]\w*$", decl[k - 1]):
                        name = decl[k - 1]
                if name:
                    cur = (name, "static" in decl, set())
                    defs.append(cur)
                else:
                    cur = None
                decl = []
                depth = 1
            elif t == ";":
                decl = []
            else:
                decl.append(t)
                if "=" in decl and (t[0].isalpha() or t[0] == "_"):
                    refs.add(t)  # scalar initializers of globals
            continue
        if t == "{":
            depth += 1
        elif t == "}":
            depth -= 1
            if depth == 0:
                cur = None
        elif t[0].isalpha() or t[0] == "_":
            refs.add(t)
            if cur:
                cur[2].add(t)
    return defs, refs


def header_inlines(folder):
    """static inline functions of the folder's headers: name -> the identifiers they use."""
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".h"):
            with open(os.path.join(folder, f), encoding="utf-8") as fh:
                defs, _ = scan(fh.read())
            for name, _, body in defs:
                out[name] = body
    return out


def graph(folder):
    files = sorted(f for f in os.listdir(folder) if f.endswith(".c"))
    defined, refs = {}, {}
    for f in files:
        with open(os.path.join(folder, f), encoding="utf-8") as fh:
            d, r = scan(fh.read())
        defined[f] = sorted(name for name, st, _ in d if not st)
        refs[f] = r - {name for name, _, _ in d}
    inl = header_inlines(folder)
    # Expand the header inlines a file uses (transitively) into its references.
    for f in files:
        todo = [x for x in refs[f] if x in inl]
        seen = set()
        while todo:
            x = todo.pop()
            if x in seen:
                continue
            seen.add(x)
            refs[f] |= inl[x]
            todo.extend(y for y in inl[x] if y in inl)
    owner = {}
    for f in files:
        for name in defined[f]:
            if name in owner:
                print(f"warning: {name} defined in {owner[name]} and {f}", file=sys.stderr)
            owner[name] = f
    uses = {f: {} for f in files}
    for f in files:
        for x in refs[f]:
            g = owner.get(x)
            if g and g != f:
                uses[f].setdefault(g, []).append(x)
    return files, defined, uses


def sccs(nodes, edges):
    """Tarjan's strongly connected components (iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def nm_graph(objdir, files):
    """The same arrows from the objects: A -> B where A's object leaves undefined a symbol
    B's object defines."""
    objs = {}
    for o in os.listdir(objdir):
        if o.endswith(".c.o"):
            objs[o[:-2]] = os.path.join(objdir, o)
    dfn, und = {}, {}
    for f, path in objs.items():
        out = subprocess.run(["nm", "-g", path], capture_output=True, text=True, check=True)
        dfn[f], und[f] = set(), set()
        for line in out.stdout.splitlines():
            p = line.split()
            if len(p) == 2 and p[0] == "U":
                und[f].add(p[1])
            elif len(p) == 3 and p[1] in "TDBRC":
                dfn[f].add(p[2])
    owner = {s: f for f in dfn for s in dfn[f]}
    arrows = set()
    for f in und:
        for s in und[f]:
            if s in owner and owner[s] != f:
                arrows.add((f, owner[s]))
    return arrows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="codegen")
    ap.add_argument("--nm")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--fail-on-cycle", action="store_true")
    a = ap.parse_args()
    files, defined, uses = graph(a.dir)
    arrows = sorted((f, g) for f in files for g in uses[f])
    if not a.quiet:
        for f in files:
            print(f"{f}: defines {len(defined[f])}: {' '.join(defined[f])}")
            for g in sorted(uses[f]):
                print(f"    -> {g}: {' '.join(sorted(uses[f][g]))}")
        print()
    print(f"files: {len(files)}")
    print(f"arrows: {len(arrows)}")
    for f, g in arrows:
        print(f"  {f} -> {g}")
    comps = [c for c in sccs(files, {f: set(uses[f]) for f in files}) if len(c) > 1]
    print(f"cycles (strongly connected components of more than one file): {len(comps)}")
    for c in comps:
        inner = sum(1 for f, g in arrows if f in c and g in c)
        print(f"  {len(c)} files, {inner} arrows inside: {' '.join(c)}")
    if a.nm:
        na = nm_graph(a.nm, files)
        sa = set(arrows)
        print(f"nm cross-check: {len(na)} arrows from the objects;"
              f" {'same' if na == sa else 'DIFFERENT'}")
        for x in sorted(na - sa):
            print(f"  only in nm: {x[0]} -> {x[1]}")
        for x in sorted(sa - na):
            print(f"  only in the sources: {x[0]} -> {x[1]}")
    return 1 if a.fail_on_cycle and comps else 0


if __name__ == "__main__":
    sys.exit(main())
