#!/bin/sh
# Data parallel training in the Fashion-MNIST example, as TAP: under mpiexec -n 2 a global
# batch the ranks do not divide is a usage error; a few steps log only from rank 0 and lose
# what one process loses on the same global batch; the text report and the progress lines
# come from rank 0 alone; the JSON line says world_size 2 and counts the collectives; --save
# writes one file that a single process loads to the same accuracy; --init's loss-scaler
# state reaches every rank; a rank that fails ends the job at once with its message; ranks
# started with another --amp or --batch-size fail at the first training step, every rank
# naming the first node where their steps differ.
# Usage: test_fashion_mnist_dp.sh /path/to/fashion_mnist MPIEXEC|"" HAVE_MPI(0|1)
set -u

if [ $# -ne 3 ]; then
    echo "usage: $0 /path/to/fashion_mnist MPIEXEC|'' HAVE_MPI" >&2
    exit 2
fi
EX=$1
MPIEXEC=$2
HAVE_MPI=$3
DATA=${LOOM_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
    echo "1..0 # SKIP no Fashion-MNIST in $DATA (Debian's dataset-fashion-mnist)"
    exit 0
fi
if [ "$HAVE_MPI" != 1 ]; then
    echo "1..0 # SKIP Loom was built without MPI"
    exit 0
fi
if [ -z "$MPIEXEC" ]; then
    echo "1..0 # SKIP mpiexec not found"
    exit 0
fi
# The jobs must not inherit a launcher or settings from whoever runs the suite.
unset LOOM_DIST LOOM_DIST_TIMEOUT_S LOOM_NUM_THREADS PMI_RANK PMI_SIZE PMI_FD PMIX_RANK \
    OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE
# No run here may outlive this many seconds, whatever MPI does.
GUARD=120
# A few steps keep the script short (compiled steps; each run compiles its graphs afresh).
STEPS=4

TMP=$(mktemp -d "${TMPDIR:-/tmp}/loom-dp-test.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM
echo "1..10"

n=0
failed=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() {
    n=$((n + 1))
    echo "not ok $n - $1"
    shift
    for f in "$@"; do
        [ -f "$f" ] && sed "s|^|# $(basename "$f"): |" "$f"
    done
    failed=$((failed + 1))
}
# field FILE NAME: a value from the example's JSON line
field() { sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" "$1" | tail -n 1; }
# same_losses A B: both outputs log $STEPS losses (`step=N loss=X`) and each of A's is within
# 1e-4 relative of B's; the pairs ("step 0 loss X step 0 loss Y" lines) are left in $TMP/pairs.
same_losses() {
    grep "^step=" "$1" >"$TMP/a.losses"
    grep "^step=" "$2" >"$TMP/b.losses"
    paste -d ' ' "$TMP/a.losses" "$TMP/b.losses" | tr '=' ' ' >"$TMP/pairs"
    [ "$(wc -l <"$TMP/a.losses")" -eq $STEPS ] && [ "$(wc -l <"$TMP/b.losses")" -eq $STEPS ] &&
        awk -v steps=$STEPS '
            { seen++; a = $4; b = $8; d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b
              if ($2 != $6 || d > 1e-4 * m) bad++ }
            END { exit !(seen == steps && bad == 0) }' "$TMP/pairs"
}

timeout $GUARD "$MPIEXEC" -n 2 "$EX" --batch-size 63 >"$TMP/odd" 2>"$TMP/odd.err"
rc=$?
if [ $rc -eq 2 ] && [ "$(grep -c "batch-size 63 is the global batch, split evenly over the 2 ranks" \
    "$TMP/odd.err")" -eq 1 ]; then
    ok "a global batch of 63 on 2 ranks is a usage error, reported once"
else
    echo "exit $rc" >>"$TMP/odd.err"
    not_ok "a global batch of 63 on 2 ranks is a usage error, reported once" "$TMP/odd.err"
fi

# The same global batches (shuffled by seed + epoch) on 2 ranks and in one process.
common="--model mlp --limit-steps $STEPS --log-every 1 --json"
mkdir "$TMP/save"
timeout $GUARD "$MPIEXEC" -n 2 "$EX" $common --save "$TMP/save/w.safetensors" \
    >"$TMP/dp" 2>"$TMP/dp.err"
rc_dp=$?
timeout $GUARD "$EX" $common >"$TMP/one" 2>"$TMP/one.err"
rc_one=$?
if [ $rc_dp -eq 0 ] && [ "$(grep -c "^step=" "$TMP/dp")" -eq $STEPS ] &&
    [ "$(grep -c '^{' "$TMP/dp")" -eq 1 ] && [ "$(wc -l <"$TMP/dp")" -eq $((STEPS + 1)) ]; then
    ok "mpiexec -n 2: only rank 0 prints ($STEPS loss lines and one JSON line)"
else
    echo "exit $rc_dp" >>"$TMP/dp.err"
    not_ok "mpiexec -n 2: only rank 0 prints" "$TMP/dp" "$TMP/dp.err"
fi
if [ $rc_one -eq 0 ] && same_losses "$TMP/dp" "$TMP/one"; then
    ok "2 ranks lose what one process loses on the same global batch ($(head -n 1 "$TMP/pairs"))"
else
    echo "exit $rc_one" >>"$TMP/one.err"
    not_ok "2 ranks lose what one process loses (2 ranks | 1 process)" "$TMP/pairs" "$TMP/one.err"
fi
# The text report: rank 0's alone (one header naming the ranks, one report with the
# collectives' metrics), and progress lines on stderr as many as one process prints.
timeout $GUARD "$MPIEXEC" -n 2 "$EX" --model mlp --limit-steps $STEPS >"$TMP/text" 2>"$TMP/text.err"
rc=$?
timeout $GUARD "$EX" --model mlp --limit-steps $STEPS >"$TMP/text1" 2>"$TMP/text1.err"
rc=$((rc + $?))
if [ $rc -eq 0 ] && [ "$(grep -c "^model mlp .*, 2 ranks (32 images per rank and step)$" "$TMP/text")" -eq 1 ] &&
    [ "$(grep -c "^model mlp" "$TMP/text")" -eq 1 ] && [ "$(grep -c "^test accuracy:" "$TMP/text")" -eq 1 ] &&
    [ "$(grep -c "^--- metrics ---" "$TMP/text")" -eq 1 ] &&
    [ "$(grep -c "^2 ranks: .* MB in collectives on rank 0" "$TMP/text")" -eq 1 ] &&
    [ "$(grep -c "^Counter: CollectiveBytes" "$TMP/text")" -eq 1 ] &&
    [ "$(grep -c "^epoch 1/1 step" "$TMP/text.err")" -eq "$(grep -c "^epoch 1/1 step" "$TMP/text1.err")" ] &&
    [ "$(grep -c . "$TMP/text.err")" -eq "$(grep -c "^epoch 1/1 step" "$TMP/text.err")" ]; then
    ok "the text report and progress lines come from rank 0 alone"
else
    echo "exit status sum $rc" >>"$TMP/text.err"
    not_ok "the text report and progress lines come from rank 0 alone" "$TMP/text" "$TMP/text.err" \
        "$TMP/text1.err"
fi

# Rank 0's collectives: the MLP's 669706 f32 parameters broadcast once and its gradients
# all-reduced each step, plus a few bytes a step (the loss, the ranks' agreement check).
bytes=$(field "$TMP/dp" collective_bytes)
least=$(((STEPS + 1) * 4 * 669706))
if [ "$(field "$TMP/dp" world_size)" = 2 ] && [ "$(field "$TMP/one" world_size)" = 1 ] &&
    [ "$(field "$TMP/one" collective_bytes)" = 0 ] && [ "$(field "$TMP/dp" steps)" = $STEPS ] &&
    [ "${bytes:-0}" -ge $least ] && [ "${bytes:-0}" -le $((least + (STEPS + 1) * 1024)) ]; then
    ok "the JSON line says world_size 2 (1 alone) and $bytes bytes in collectives (0 alone)"
else
    not_ok "the JSON line's world_size and collective_bytes" "$TMP/dp" "$TMP/one"
fi

# One file, rank 0's, which a single process loads to the same test accuracy.
timeout $GUARD "$EX" --model mlp --epochs 0 --json --init "$TMP/save/w.safetensors" \
    >"$TMP/load" 2>"$TMP/load.err"
rc=$?
acc_dp=$(field "$TMP/dp" test_accuracy)
acc_load=$(field "$TMP/load" test_accuracy)
if [ $rc -eq 0 ] && [ "$(ls "$TMP/save")" = w.safetensors ] && [ -n "$acc_dp" ] &&
    [ "$acc_dp" = "$acc_load" ]; then
    ok "--save on 2 ranks writes one file; one process loads it to the same accuracy $acc_load"
else
    ls -la "$TMP/save" >"$TMP/ls" 2>&1
    echo "exit $rc; accuracy on 2 ranks $acc_dp, loaded $acc_load" >>"$TMP/load.err"
    not_ok "--save on 2 ranks: one file, loadable" "$TMP/ls" "$TMP/load" "$TMP/load.err"
fi

# A checkpoint whose loss scale is 1024 (f16, static): with --init (read by rank 0) the
# dynamic scaler starts there on every rank. A rank left at the default 65536 would average
# gradients scaled differently, and the losses would leave the single process's.
timeout $GUARD "$EX" --model mlp --limit-steps 1 --amp f16 --loss-scale 1024 --json \
    --save "$TMP/s1024.safetensors" >"$TMP/s1024" 2>"$TMP/s1024.err"
rc=$?
amp="--model mlp --limit-steps $STEPS --log-every 1 --json --amp f16 --init $TMP/s1024.safetensors"
timeout $GUARD "$MPIEXEC" -n 2 "$EX" $amp >"$TMP/amp_dp" 2>"$TMP/amp_dp.err" &&
    timeout $GUARD "$EX" $amp >"$TMP/amp_one" 2>"$TMP/amp_one.err"
rc=$((rc + $?))
if [ $rc -eq 0 ] && same_losses "$TMP/amp_dp" "$TMP/amp_one" &&
    [ "$(field "$TMP/amp_dp" loss_scale)" = 1024 ]; then
    ok "--init's loss scale 1024 reaches both ranks: f16 losses equal one process's"
else
    echo "exit status sum $rc" >>"$TMP/amp_dp.err"
    not_ok "--init's loss scale reaches both ranks (2 ranks | 1 process)" "$TMP/pairs" \
        "$TMP/amp_dp" "$TMP/amp_dp.err" "$TMP/s1024.err"
fi

# Rank 0 cannot read --init while rank 1 waits for its broadcast: the job ends at once with
# rank 0's message and a non-zero status (MPI left unfinalized on purpose: no leak checks).
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export ASAN_OPTIONS
start=$(date +%s)
timeout $GUARD "$MPIEXEC" -n 2 "$EX" --model mlp --limit-steps 1 --init "$TMP/missing.safetensors" \
    >"$TMP/bad" 2>"$TMP/bad.err"
rc=$?
took=$(($(date +%s) - start))
if [ $rc -eq 1 ] && [ $took -lt 30 ] &&
    grep -q "fashion_mnist (rank 0 of 2): --init: .*missing.safetensors" "$TMP/bad.err"; then
    ok "a rank that fails ends the job with its message and exit 1 ($took s)"
else
    echo "exit $rc after $took s" >>"$TMP/bad.err"
    not_ok "a rank that fails ends the job with its message" "$TMP/bad.err"
fi
# Ranks that disagree: once they trained apart (--amp) or for 468 steps on unequal shards
# before a timeout (--batch-size). MPMD: one rank with each setting.
names_node() { # names_node RANK: its message names what both ranks have at the first difference
    grep "fashion_mnist (rank $1 of 2): training step: .*rank $1 of 2: the ranks are not running the same step" \
        "$TMP/dis.err" | grep -F "rank 0: \`$has0" | grep -qF "rank 1: \`$has1"
}
disagree() { # disagree NAME WHAT-RANK-0-HAS WHAT-RANK-1-HAS ARGS-0 -- ARGS-1
    name=$1 has0=$2 has1=$3
    shift 3
    a="" b="" side=0
    for w in "$@"; do
        if [ "$w" = "--" ]; then side=1; elif [ $side = 0 ]; then a="$a $w"; else b="$b $w"; fi
    done
    start=$(date +%s)
    # shellcheck disable=SC2086 # the argument lists split on purpose
    timeout $GUARD "$MPIEXEC" -n 1 "$EX" --model mlp --limit-steps $STEPS --log-every 1 $a : \
        -n 1 "$EX" --model mlp --limit-steps $STEPS --log-every 1 $b >"$TMP/dis" 2>"$TMP/dis.err"
    rc=$?
    took=$(($(date +%s) - start))
    if [ $rc -eq 1 ] && [ $took -lt 60 ] && [ "$(grep -c "^step=" "$TMP/dis")" -eq 0 ] &&
        names_node 0 && names_node 1; then
        ok "$name: both ranks fail at the first step naming the node ($took s)"
    else
        echo "exit $rc after $took s" >>"$TMP/dis.err"
        not_ok "$name: both ranks fail at the first step naming the node" "$TMP/dis" "$TMP/dis.err"
    fi
}
disagree "--amp none on rank 0, bf16 on rank 1" \
    "%2 = transpose %0 {perm = [1, 0]} : f32[784,32]" \
    "%2 = transpose %0 {perm = [1, 0], autocast = bf16} : f32[784,32]" --amp none -- --amp bf16
disagree "--batch-size 64 on rank 0, 128 on rank 1" \
    "%0 = input {index = 0} : f32[32,784]" "%0 = input {index = 0} : f32[64,784]" \
    --batch-size 64 -- --batch-size 128

[ $failed -eq 0 ]
