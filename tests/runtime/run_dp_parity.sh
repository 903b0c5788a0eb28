#!/bin/sh
# Data-parallel parity as TAP: dp_parity (one process per rank) trains a tiny MLP with the
# global batch split across the ranks and checks every rank against one process taking the
# whole batch, for SGD, AdamW and bf16 AMP with an overflow on one rank; without a launcher
# (the self backend) and under mpiexec -n 1, 2 and 3 (the gradients in one bucket), and on 2
# ranks with LOOM_ALLREDUCE_BUCKET_MB=0 (one bucket per gradient); and on 2 and 3 ranks that
# each trace another batch size (DP_PARITY_DISAGREE=1), which must fail on every rank.
# Usage: run_dp_parity.sh /path/to/dp_parity MPIEXEC|"" HAVE_MPI(0|1)
set -u

if [ $# -ne 3 ]; then
    echo "usage: $0 /path/to/dp_parity MPIEXEC|'' HAVE_MPI" >&2
    exit 2
fi
PROG=$1
MPIEXEC=$2
HAVE_MPI=$3
unset LOOM_DIST LOOM_DIST_TIMEOUT_S LOOM_NUM_THREADS LOOM_ALLREDUCE_BUCKET_MB PMI_RANK PMI_SIZE \
    PMI_FD PMIX_RANK OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE
# A rank left waiting in a collective fails well within the guard, with a message.
LOOM_DIST_TIMEOUT_S=20
export LOOM_DIST_TIMEOUT_S
GUARD=120

TMP=$(mktemp -d "${TMPDIR:-/tmp}/loom-dp-test.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM

n=0
failed=0
# job NAME NP COMMAND...: runs the command under the guard and checks its exit code and that
# each of the NP ranks printed its "0 failed" line; shows the output either way.
job() {
    name=$1
    np=$2
    shift 2
    start=$(date +%s)
    timeout $GUARD "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    took=$(($(date +%s) - start))
    n=$((n + 1))
    if [ $rc -eq 0 ] && [ "$(grep -c "checks passed, 0 failed" "$TMP/out")" -eq "$np" ]; then
        echo "ok $n - $name ($took s)"
    else
        echo "not ok $n - $name (exit $rc, $took s)"
        failed=$((failed + 1))
    fi
    sed 's/^/# /' "$TMP/out" "$TMP/err"
}

echo "1..7"
job "no launcher: 1 rank (self backend) matches one process" 1 "$PROG" 1

for np in 1 2 3; do
    name="mpiexec -n $np: each rank's share of the batch gives one process's parameters"
    if [ "$HAVE_MPI" != 1 ] || [ -z "$MPIEXEC" ]; then
        n=$((n + 1))
        echo "ok $n - $name # SKIP no MPI or no mpiexec"
        continue
    fi
    job "$name" $np "$MPIEXEC" -n $np "$PROG" $np
done
name="mpiexec -n 2, LOOM_ALLREDUCE_BUCKET_MB=0: the same with one bucket per gradient"
if [ "$HAVE_MPI" = 1 ] && [ -n "$MPIEXEC" ]; then
    job "$name" 2 env LOOM_ALLREDUCE_BUCKET_MB=0 "$MPIEXEC" -n 2 "$PROG" 2
else
    n=$((n + 1))
    echo "ok $n - $name # SKIP no MPI or no mpiexec"
fi
for np in 2 3; do
    name="mpiexec -n $np, each rank another batch: every rank fails at the step naming the node"
    if [ "$HAVE_MPI" = 1 ] && [ -n "$MPIEXEC" ]; then
        job "$name" $np env DP_PARITY_DISAGREE=1 "$MPIEXEC" -n $np "$PROG" $np
    else
        n=$((n + 1))
        echo "ok $n - $name # SKIP no MPI or no mpiexec"
    fi
done
exit $((failed > 0))
