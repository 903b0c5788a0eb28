#!/usr/bin/env bash
# Installs the Debian packages Loom needs (when any is missing) and configures + builds
# build/ (and build-asan/ with ASan+UBSan when --asan is given). Idempotent: a second run
# only rebuilds what changed. Used by `make demo`, `make test` and .ci/run.
# --bench also installs what only the benchmarks compare against (OpenBLAS, oneDNN, PyTorch
# and torchvision) and reconfigures build/ so bench_gemm and bench_conv find them.
set -euo pipefail
cd "$(dirname "$0")/.."

asan=false
bench=false
for arg in "$@"; do
    case "$arg" in
    --asan) asan=true ;;
    --bench) bench=true ;;
    *) echo "usage: scripts/setup.sh [--asan] [--bench]" >&2; exit 2 ;;
    esac
done

PACKAGES=(build-essential g++ pkg-config ninja-build meson llvm-19-dev libmlir-19-dev
          mlir-19-tools libcmocka-dev zlib1g-dev libxxhash-dev libsodium-dev mpich libmpich-dev dataset-fashion-mnist
          graphviz) # graphviz: the tests render the DOT dumps with dot
# Benchmarks only (bench/README.md): the libraries and the PyTorch they measure Loom against.
BENCH_PACKAGES=(libopenblas-dev libdnnl-dev python3-torch python3-torchvision python3-numpy)
$bench && PACKAGES+=("${BENCH_PACKAGES[@]}")

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "loom setup: installing ${missing[*]}" >&2
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || { echo "loom setup: need root or sudo to install packages" >&2; exit 1; }
        SUDO="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

werror=false
[ "${CI:-}" = "true" ] && werror=true

configure() { # dir, extra meson args...
    local dir=$1; shift
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" --native-file scripts/native.ini -Dwerror=$werror "$@"
    fi
    ninja -C "$dir"
}

# A build/ configured before the benchmark libraries were installed must look for them again.
if $bench && [ -f build/build.ninja ] && [ ${#missing[@]} -gt 0 ]; then
    meson setup --reconfigure build --native-file scripts/native.ini -Dwerror=$werror
fi
configure build
if $asan; then
    configure build-asan -Db_sanitize=address,undefined -Db_lundef=false
fi
