"""OpenBLAS's kernels for this CPU, chosen before torch loads it.

Debian 12's OpenBLAS (0.3.21) takes CPUs newer than it knows for old ones: an Intel Xeon of
family 6 model 207 (AVX-512, its BF16 hidden by the VM) ran as "Prescott", SSE3 kernels at 41
GFLOP/s where its SkylakeX kernels give 175 (a 1024^3 matmul on 2 threads), which left
PyTorch 5x slower than it can be. OpenBLAS reads OPENBLAS_CORETYPE when it loads, so each
PyTorch benchmark calls pin() before `import torch`: when OpenBLAS's own choice (asked of a
child process, which loads it without torch) is a core without AVX2 on a CPU that has AVX2
and FMA, OPENBLAS_CORETYPE becomes SkylakeX (AVX-512 F, BW, DQ and VL present) or Haswell,
and a line on stderr says so. A value the user set is kept. Returns the core in use, to be
named beside the figures.
"""
import os
import subprocess
import sys

# OpenBLAS's x86-64 cores with AVX2 kernels or better (driver/others/dynamic.c's names)
_MODERN = ("Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids")

_ASK = ("import ctypes\n"
        "l = ctypes.CDLL('libopenblas.so.0')\n"
        "l.openblas_get_corename.restype = ctypes.c_char_p\n"
        "print(l.openblas_get_corename().decode())\n")


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _core():
    try:
        out = subprocess.run([sys.executable, "-c", _ASK], check=True, capture_output=True,
                             text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


def pin():
    if os.environ.get("OPENBLAS_CORETYPE"):
        return os.environ["OPENBLAS_CORETYPE"]
    core = _core()
    if core is None or core in _MODERN:
        return core
    flags = _cpu_flags()
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        want = "SkylakeX"
    elif {"avx2", "fma"} <= flags:
        want = "Haswell"
    else:
        return core
    os.environ["OPENBLAS_CORETYPE"] = want
    print(f"openblas_core: OpenBLAS took this CPU for {core}; PyTorch runs with "
          f"OPENBLAS_CORETYPE={want} (its {want} kernels)", file=sys.stderr)
    return want
