#!/bin/sh
# Several machines (issue 10, item 7), as TAP: two "hosts" are network namespaces joined by a
# veth pair (10.231.0.1 and 10.231.0.2); mpiexec (MPICH's Hydra) runs in the first with a
# hostfile naming both addresses, and a launcher script standing in for ssh starts the second
# host's proxy inside its namespace. The data-parallel parity program runs one rank on each
# host over MPI's TCP transport (UCX and Open MPI are told to use TCP only, else they would
# notice the shared machine and use shared memory), and its final state must be bitwise the
# single-host run's. Skips, saying why, without root, ip netns, a veth pair or Hydra.
# Usage: run_netns.sh /path/to/dp_parity MPIEXEC|"" HAVE_MPI(0|1)
set -u

if [ $# -ne 3 ]; then
    echo "usage: $0 /path/to/dp_parity MPIEXEC|'' HAVE_MPI" >&2
    exit 2
fi
PROG=$1
MPIEXEC=$2
HAVE_MPI=$3
unset LOOM_DIST PMI_RANK PMI_SIZE PMI_FD PMIX_RANK OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE
# One thread per rank in both runs, so that the two compute alike to the bit; a rank left
# waiting fails within 20 s; nothing outlives the guard.
LOOM_NUM_THREADS=1
LOOM_DIST_TIMEOUT_S=20
export LOOM_NUM_THREADS LOOM_DIST_TIMEOUT_S
GUARD=120
# The traffic that must cross the veth: at least each step's gradients, 20 steps x 3 cases x
# 424 bytes (half of them bf16), and much more in practice (~110 kB).
MIN_BYTES=25000

skip_all() {
    echo "1..0 # SKIP $1"
    exit 0
}
[ "$HAVE_MPI" = 1 ] || skip_all "built without MPI"
[ -n "$MPIEXEC" ] || skip_all "mpiexec not found"
"$MPIEXEC" --version 2>/dev/null | grep -q HYDRA ||
    skip_all "mpiexec is not MPICH's Hydra (needs -launcher-exec and -localhost)"
[ "$(id -u)" -eq 0 ] || skip_all "network namespaces need root"
command -v ip >/dev/null || skip_all "no ip command (iproute2)"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/loom-netns-test.XXXXXX") || exit 1
# Namespace and interface names unique to this run (interface names: at most 15 bytes).
NS_A=loomdp$$a
NS_B=loomdp$$b
ADDR_A=10.231.0.1
ADDR_B=10.231.0.2
# Ends what still runs in the namespaces (only processes this script started there), then
# deletes them (and so the veth pair) and the files, on every way out.
cleanup() {
    for ns in $NS_A $NS_B; do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        # shellcheck disable=SC2086 # one pid per word
        [ -n "$pids" ] && kill -9 $pids 2>/dev/null
        ip netns del "$ns" 2>/dev/null
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

ip netns add $NS_A 2>"$TMP/err" || skip_all "ip netns add failed: $(head -c 200 "$TMP/err")"
ip netns add $NS_B 2>"$TMP/err" &&
    ip link add v$NS_A type veth peer name v$NS_B 2>>"$TMP/err" &&
    ip link set v$NS_A netns $NS_A 2>>"$TMP/err" &&
    ip link set v$NS_B netns $NS_B 2>>"$TMP/err" &&
    ip -n $NS_A addr add $ADDR_A/24 dev v$NS_A 2>>"$TMP/err" &&
    ip -n $NS_B addr add $ADDR_B/24 dev v$NS_B 2>>"$TMP/err" &&
    ip -n $NS_A link set lo up 2>>"$TMP/err" && ip -n $NS_B link set lo up 2>>"$TMP/err" &&
    ip -n $NS_A link set v$NS_A up 2>>"$TMP/err" &&
    ip -n $NS_B link set v$NS_B up 2>>"$TMP/err" ||
    skip_all "cannot join two namespaces by a veth pair: $(head -c 200 "$TMP/err")"

printf '%s:1\n%s:1\n' $ADDR_A $ADDR_B >"$TMP/hosts"
# Hydra's ssh launcher runs `LAUNCHER [-x] HOST COMMAND`: run COMMAND in HOST's namespace
# through a shell, as sshd would.
cat >"$TMP/launch" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do
    case "\$1" in
    $ADDR_A) ns=$NS_A ;;
    $ADDR_B) ns=$NS_B ;;
    *) shift; continue ;;
    esac
    shift
    exec ip netns exec "\$ns" sh -c "\$*"
done
echo "launch: no known host in: \$*" >&2
exit 127
EOF
chmod +x "$TMP/launch"

tx_bytes() {
    ip netns exec $NS_A cat /sys/class/net/v$NS_A/statistics/tx_bytes 2>/dev/null || echo 0
}

echo "1..3"
# The single-host run first: its digests are what the two hosts must reproduce.
timeout $GUARD "$MPIEXEC" -n 2 "$PROG" 2 2 >"$TMP/one_host" 2>"$TMP/one_host_err"
rc1=$?
before=$(tx_bytes)
start=$(date +%s)
timeout $GUARD ip netns exec $NS_A "$MPIEXEC" -f "$TMP/hosts" -launcher ssh \
    -launcher-exec "$TMP/launch" -localhost $ADDR_A -genv UCX_TLS tcp,self \
    -genv OMPI_MCA_btl tcp,self -n 2 "$PROG" 2 1 >"$TMP/two_hosts" 2>"$TMP/two_hosts_err"
rc2=$?
took=$(($(date +%s) - start))
sent=$(($(tx_bytes) - before))

failed=0
result() { # ok?, name, files to show on failure
    if [ "$1" = 0 ]; then
        echo "ok $2"
    else
        echo "not ok $2"
        failed=$((failed + 1))
        shift 2
        for f in "$@"; do sed 's/^/# /' "$f"; done
    fi
}

name="1 - two hosts (namespaces): both ranks pass, one rank on each machine ($took s)"
[ $rc2 -eq 0 ] && [ "$(grep -c "checks passed, 0 failed" "$TMP/two_hosts")" -eq 2 ]
result $? "$name" "$TMP/two_hosts" "$TMP/two_hosts_err"

grep '^digest ' "$TMP/one_host" >"$TMP/d1"
grep '^digest ' "$TMP/two_hosts" >"$TMP/d2"
name="2 - the two-host run ends bitwise as the single-host run ($(wc -l <"$TMP/d1") digests)"
[ $rc1 -eq 0 ] && [ -s "$TMP/d1" ] && cmp -s "$TMP/d1" "$TMP/d2"
result $? "$name" "$TMP/one_host" "$TMP/one_host_err" "$TMP/d2"

name="3 - MPI's traffic crossed the veth pair ($sent bytes sent, at least $MIN_BYTES)"
[ "$sent" -ge $MIN_BYTES ]
result $? "$name"
exit $((failed > 0))
