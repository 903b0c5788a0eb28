#!/bin/sh
# Writes OUT with a hash of the given source files (those that shape compiled code: the op
# table, the passes that plan kernels, codegen), so the on-disk compile cache never serves
# object code built by a different Loom. Meson reruns it when one of them changes.
# usage: build_id.sh OUT FILE...
set -eu
out=$1
shift
id=$(cat "$@" | sha256sum | cut -c1-16)
printf '#define LOOM_BUILD_ID "%s"\n' "$id" > "$out"
