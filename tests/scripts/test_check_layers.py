#!/usr/bin/env python3
"""Tests of scripts/check_layers.py, the build's layering check, as TAP: the real tree
passes; a copy of its layers with one planted include at a time fails with the file:line,
the include and the rule it breaks (upward, in a header, through "../", in the <> form,
into tests/, MLIR outside codegen/, a public header reaching a layer, a macro); includes
that are allowed or commented out pass; the stamp and the depfile say what ninja needs.
Usage: test_check_layers.py /path/to/scripts/check_layers.py SOURCE_ROOT
"""

import os
import shutil
import subprocess
import sys
import tempfile

if len(sys.argv) != 3:
    print("usage: %s /path/to/check_layers.py SOURCE_ROOT" % sys.argv[0], file=sys.stderr)
    sys.exit(2)
CHECKER, ROOT = sys.argv[1], os.path.realpath(sys.argv[2])
FOLDERS = ["ir", "runtime", "passes", "codegen", "targets", "frontend", "include"]
TMP = os.path.realpath(tempfile.mkdtemp(prefix="loom-layers-test."))
TREE = os.path.join(TMP, "tree")
n = 0
failed = 0


def ok(cond, desc, detail=""):
    global n, failed
    n += 1
    print("%s %d - %s" % ("ok" if cond else "not ok", n, desc))
    if not cond:
        failed += 1
        for line in detail.splitlines():
            print("# " + line)


def run(root, *extra):
    p = subprocess.run([sys.executable, CHECKER, *extra, root], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def planted(path, text, line=None):
    """Writes TEXT into TREE/PATH as line LINE (1-based; None: appended; a new file when
    PATH is missing); returns the line it landed on and the old contents (None), for restore."""
    full = os.path.join(TREE, path)
    old = None
    if os.path.exists(full):
        with open(full, encoding="utf-8") as f:
            old = f.read()
    lines = [] if old is None else old.split("\n")
    if old is not None and old.endswith("\n"):
        lines.pop()
    at = len(lines) + 1 if line is None else line
    lines[at - 1:at - 1] = text.split("\n")
    with open(full, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return at, old


def restore(path, old):
    if old is None:
        os.remove(os.path.join(TREE, path))
        return
    with open(os.path.join(TREE, path), "w", encoding="utf-8") as f:
        f.write(old)


def expect_fail(desc, path, text, message, line=None, at_offset=0):
    """Plants TEXT in PATH; the check must exit 1 with "PATH:LINE: MESSAGE" among its lines."""
    at, old = planted(path, text, line)
    try:
        rc, out = run(TREE)
        want = "%s:%d: %s" % (path, at + at_offset, message)
        ok(rc == 1 and want in out.splitlines(), desc,
           "exit %d, wanted 1 and the line\n%s\ngot:\n%s" % (rc, want, out))
    finally:
        restore(path, old)


def expect_pass(desc, path, text, line=None):
    at, old = planted(path, text, line)
    try:
        rc, out = run(TREE)
        ok(rc == 0 and out == "", desc, "exit %d, wanted 0 and no output; got:\n%s" % (rc, out))
    finally:
        restore(path, old)


try:
    rc, out = run(ROOT)
    ok(rc == 0 and out == "", "the real tree passes", "exit %d:\n%s" % (rc, out))

    os.mkdir(TREE)
    for d in FOLDERS:
        shutil.copytree(os.path.join(ROOT, d), os.path.join(TREE, d))
    rc, out = run(TREE)
    ok(rc == 0 and out == "", "a copy of the layers passes", "exit %d:\n%s" % (rc, out))

    expect_fail("ir/ including frontend/ fails, naming file:line, the include and the rule",
                "ir/hash.c", '#include "frontend/frontend.h"',
                '#include "frontend/frontend.h": ir/ may include only ir/ and include/', line=5)
    expect_fail("an upward include in a header fails",
                "runtime/kernel.h", '#include "passes/passes.h"',
                '#include "passes/passes.h": runtime/ may include only runtime/, ir/ and '
                'include/')
    expect_fail("a new header that nothing compiles yet is checked too",
                "runtime/new_header.h", '#pragma once\n#include "frontend/frontend.h"',
                '#include "frontend/frontend.h": runtime/ may include only runtime/, ir/ and '
                'include/', at_offset=1)
    expect_fail("a path through ../ counts as the folder it reaches",
                "passes/dce.c", '#include "../codegen/codegen.h"',
                '#include "../codegen/codegen.h": passes/ may include only passes/, ir/ and '
                'include/', line=1)
    expect_fail("the <> form is checked too",
                "ir/ir.h", "#include <runtime/runtime.h>",
                "#include <runtime/runtime.h>: ir/ may include only ir/ and include/")
    expect_fail("codegen/ may not include frontend/",
                "codegen/codegen.h", '#include "frontend/frontend.h"',
                '#include "frontend/frontend.h": codegen/ may include only codegen/, ir/, '
                'runtime/ and include/')
    expect_fail("passes/ and runtime/ are not below each other",
                "runtime/trace.c", '#include "passes/passes.h"',
                '#include "passes/passes.h": runtime/ may include only runtime/, ir/ and '
                'include/')
    expect_fail("a layer may not include tests/ (on top, with tools/ and examples/)",
                "frontend/nn.c", '#include "tests/test_util.h"',
                '#include "tests/test_util.h": frontend/ may include only frontend/, ir/, '
                'runtime/, targets/ and include/')
    expect_fail("mlir-c/ outside codegen/ fails",
                "frontend/tensor.c", "#include <mlir-c/IR.h>",
                "#include <mlir-c/IR.h>: only codegen/ may include mlir-c/ headers")
    expect_fail("llvm-c/ outside codegen/ fails",
                "runtime/trace.h", "#include <llvm-c/Core.h>",
                "#include <llvm-c/Core.h>: only codegen/ may include llvm-c/ headers")
    expect_fail("a public header may include only include/",
                "include/loom/nn.h", '#include "ir/ir.h"',
                '#include "ir/ir.h": include/ may include only include/')
    expect_fail("a computed #include fails, since nothing can follow it",
                "ir/dot.c", '#define LOOM_H "frontend/frontend.h"\n#include LOOM_H',
                "#include LOOM_H: a computed #include cannot be checked; name the header",
                at_offset=1)
    expect_fail("a directive split over lines is read whole, at its first line",
                "ir/dot.c", "#  include \\\n  <frontend/frontend.h>",
                "#include <frontend/frontend.h>: ir/ may include only ir/ and include/")
    expect_fail("an include after a comment on the same line is still read",
                "ir/dot.c", '/* why */ #include "frontend/frontend.h"',
                '#include "frontend/frontend.h": ir/ may include only ir/ and include/')

    expect_pass("frontend/ may include the layers it drives", "frontend/nn.c",
                '#include "targets/targets.h"\n'
                '#include "runtime/kernel.h"\n#include "ir/plan.h"')
    expect_pass("targets/ may include passes/ and codegen/", "targets/npu.c",
                '#include "codegen/codegen.h"\n#include "passes/passes.h"')
    expect_fail("frontend/ names no compiler: codegen/ is the npu target's",
                "frontend/nn.c", '#include "codegen/codegen.h"',
                '#include "codegen/codegen.h": frontend/ may include only frontend/, ir/, '
                'runtime/, targets/ and include/')
    expect_pass("codegen/ may include mlir-c/ and llvm-c/", "codegen/mlir_build.c",
                "#include <mlir-c/IR.h>\n#include <llvm-c/Core.h>")
    expect_pass("commented-out includes are ignored", "ir/dot.c",
                '// #include "frontend/frontend.h"\n/* a\n#include "passes/passes.h"\n*/')
    expect_pass("system and generated headers pass", "ir/dot.c",
                '#include <stdio.h>\n#include "loom/version.h"\n#include "not_generated_yet.h"')

    stamp, dep = os.path.join(TMP, "ok.stamp"), os.path.join(TMP, "ok.d")
    rc, out = run(TREE, "--stamp", stamp, "--depfile", dep)
    with open(dep, encoding="utf-8") as f:
        deps = f.read()
    ok(rc == 0 and os.path.isfile(stamp), "a passing check writes its stamp", out)
    ok(os.path.join(TREE, "runtime", "kernel.h") in deps
       and os.path.join(TREE, "ir") + " " in deps.replace("\\\n", ""),
       "the depfile names the headers and folders it read, so ninja reruns it", deps[:2000])
    at, old = planted("ir/hash.c", '#include "frontend/frontend.h"')
    rc, out = run(TREE, "--stamp", stamp, "--depfile", dep)
    restore("ir/hash.c", old)
    ok(rc == 1 and not os.path.exists(stamp),
       "a failing check leaves no stamp, so the next build runs it again", out)
finally:
    shutil.rmtree(TMP, ignore_errors=True)

print("1..%d" % n)
sys.exit(1 if failed else 0)
