#!/usr/bin/env python3
"""Fails when a layer includes a header of a layer above it (DESIGN.md §2).

Run by the build before any layer compiles (scripts/meson.build), and by the tests
(tests/scripts/test_check_layers.py). Scans every file of ir/ runtime/ passes/ codegen/
frontend/ and include/, headers and .def tables too, whether or not anything compiles them,
and resolves each #include the way the compiler does with the layers' -I paths (the
including file's folder for the "" form, then include/, then the source root), so
"../frontend/frontend.h" counts as frontend/ just as "frontend/frontend.h" does.

Usage: check_layers.py [--stamp FILE] [--depfile FILE] SOURCE_ROOT
Prints one line per violation, "FILE:LINE: #include ...: RULE", and exits 1; exits 0
(writing the stamp and a depfile naming every file and folder scanned) when there is none.
Commented-out includes are ignored; a computed #include (a macro) is a violation, since
nothing can check where it leads. Only python3's standard library: Meson itself runs on it.
"""

import argparse
import os
import re
import sys

# Each layer and the folders below it that it may include, besides its own and include/.
# frontend drives the others through targets (each device's compiler: passes and codegen for
# npu, the interpreter for ref), so it names neither compiler;
# codegen uses ir and runtime's kernel ABI; passes and runtime use ir only; ir is the bottom.
BELOW = {
    "ir": [],
    "runtime": ["ir"],
    "passes": ["ir"],
    "codegen": ["ir", "runtime"],
    "targets": ["ir", "runtime", "passes", "codegen"],
    "frontend": ["ir", "runtime", "targets"],
}
# include/ holds the public headers, the only installed ones: they see only each other.
CHECKED = list(BELOW) + ["include"]
# Folders of the tree above every layer (or beside it): no layer may include them.
TOP = ["tools", "tests", "examples", "bench", "fuzz", "scripts"]
# MLIR's and LLVM's headers: codegen/ only.
EXTERNAL = ["mlir-c", "llvm-c", "mlir", "llvm"]
EXTERNAL_OWNER = "codegen"

SUFFIXES = (".c", ".h", ".def", ".inc", ".cpp", ".hpp")
INCLUDE_RE = re.compile(r'\s*#\s*include(?:_next)?\b\s*(.*)')
NAME_RE = re.compile(r'(["<])([^">]*)[">]')


def rule(folder):
    """The sentence a violation in FOLDER quotes."""
    if folder == "include":
        return "include/ may include only include/"
    allowed = [folder + "/"] + [b + "/" for b in BELOW[folder]] + ["include/"]
    if len(allowed) == 2:
        listed = " and ".join(allowed)
    else:
        listed = ", ".join(allowed[:-1]) + " and " + allowed[-1]
    return "%s/ may include only %s" % (folder, listed)


def strip_comments(text):
    """TEXT with its comments blanked (newlines kept, so line numbers stay); string and
    character literals are left alone, so a "//" inside one is not a comment."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(" " * (end - i))
            i = end
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def directives(text):
    """(line number, directive text) for each #include, continuation lines joined."""
    lines = strip_comments(text).split("\n")
    i = 0
    while i < len(lines):
        start, line = i + 1, lines[i]
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + lines[i]
        m = INCLUDE_RE.match(line)
        if m:
            yield start, m.group(1).strip()
        i += 1


def folder_of(root, path):
    """The top-level folder of the tree holding PATH, or None when it is outside the tree."""
    rel = os.path.relpath(path, root)
    if rel == ".." or rel.startswith(".." + os.sep) or os.path.isabs(rel):
        return None
    return rel.split(os.sep)[0]


def target_folder(root, includer, form, name):
    """Where #include FORM NAME from INCLUDER leads: a folder of the tree, an external
    library's folder (mlir-c, ...), "" for a system or generated header, None for outside
    the tree."""
    first = name.split("/")[0]
    if first in EXTERNAL:
        return first
    if os.path.isabs(name):
        return folder_of(root, os.path.realpath(name))
    here = os.path.dirname(includer)
    candidates = [os.path.join(here, name)] if form == '"' else []
    candidates += [os.path.join(root, "include", name), os.path.join(root, name)]
    for c in candidates:
        if os.path.isfile(c):
            return folder_of(root, os.path.realpath(c))
    # Not in the tree: a generated header (loom/version.h, codegen's build_id.h), a system
    # header, or a typo the compiler reports. A path still names the folder it means.
    if form == '"' and (name.startswith("./") or name.startswith("../")):
        return folder_of(root, os.path.normpath(os.path.join(here, name)))
    if first in CHECKED or first in TOP:
        return first
    return ""


def check_file(root, path, folder):
    """The violation lines of one file of FOLDER."""
    rel = os.path.relpath(path, root)
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    allowed = {folder, "include"} | set(BELOW.get(folder, []))
    problems = []
    for line, rest in directives(text):
        m = NAME_RE.match(rest)
        if not m:
            problems.append("%s:%d: #include %s: a computed #include cannot be checked; "
                            "name the header" % (rel, line, rest))
            continue
        form, name = m.group(1), m.group(2)
        shown = form + name + ('"' if form == '"' else ">")
        target = target_folder(root, os.path.realpath(path), form, name)
        if target == "":
            continue
        if target in EXTERNAL:
            if folder != EXTERNAL_OWNER:
                problems.append("%s:%d: #include %s: only %s/ may include %s/ headers"
                                % (rel, line, shown, EXTERNAL_OWNER, target))
        elif target is None or target not in allowed:
            problems.append("%s:%d: #include %s: %s" % (rel, line, shown, rule(folder)))
    return problems


def scan(root):
    """(violations, files and folders read) over the checked folders of ROOT."""
    problems, read = [], []
    for folder in CHECKED:
        top = os.path.join(root, folder)
        if not os.path.isdir(top):
            problems.append("%s/: missing (is %s the source root?)" % (folder, root))
            continue
        for here, dirs, files in os.walk(top):
            dirs.sort()
            read.append(here)
            for name in sorted(files):
                if name.endswith(SUFFIXES):
                    path = os.path.join(here, name)
                    read.append(path)
                    problems += check_file(root, path, folder)
    return problems, read


def main():
    ap = argparse.ArgumentParser(description="Fail on an include of a layer above.")
    ap.add_argument("root", help="the source root (the folder holding ir/, runtime/, ...)")
    ap.add_argument("--stamp", help="file to write when the tree passes")
    ap.add_argument("--depfile", help="Makefile-style list of what was read, for ninja")
    args = ap.parse_args()
    root = os.path.realpath(args.root)

    if args.stamp and os.path.exists(args.stamp):
        os.remove(args.stamp)  # a failed check must run again, whatever the timestamps say
    problems, read = scan(root)
    if args.depfile:
        # Folders too: adding a file changes its folder's time, so the check runs again.
        deps = [os.path.realpath(__file__)] + read
        with open(args.depfile, "w", encoding="utf-8") as f:
            f.write("%s: %s\n" % (escape(args.stamp or "check_layers"),
                                  " \\\n ".join(escape(d) for d in deps)))
    if problems:
        for p in problems:
            print(p, file=sys.stderr)
        print("check_layers: %d include(s) out of layer: each layer sees only its own folder, "
              "the layers below it and include/ (DESIGN.md §2)" % len(problems), file=sys.stderr)
        return 1
    if args.stamp:
        with open(args.stamp, "w", encoding="utf-8") as f:
            f.write("layers checked\n")
    return 0


def escape(path):
    """PATH as a depfile (Makefile syntax, as ninja reads it) spells it."""
    return path.replace(" ", "\\ ").replace("#", "\\#").replace("$", "$$")


if __name__ == "__main__":
    sys.exit(main())
