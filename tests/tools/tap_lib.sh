# TAP helpers for the CLI test scripts in this folder; sourced, not run. Sets TMP (a private
# folder removed on exit) and defines check, its predicates and tap_finish.

TMP=$(mktemp -d "${TMPDIR:-/tmp}/loom-cli-test.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM

n=0
failed=0
# check DESCRIPTION COMMAND...: runs the command; passes when it exits 0.
check() {
    desc=$1
    shift
    n=$((n + 1))
    if "$@" >"$TMP/check.log" 2>&1; then
        echo "ok $n - $desc"
    else
        echo "not ok $n - $desc"
        sed 's/^/# /' "$TMP/check.log"
        failed=$((failed + 1))
    fi
}

# Helpers, each a small predicate for check.
same_file() { cmp -s "$1" "$2" || { diff "$1" "$2"; return 1; }; } # shows the diff when not
differ() { ! cmp -s "$1" "$2"; }
first_line_is() { [ "$(head -n 1 "$1")" = "$2" ]; }
count_is() { [ "$(grep -c -- "$2" "$1")" -eq "$3" ]; } # count_is FILE REGEX N
has_line() { grep -qxF -- "$2" "$1" || { echo "no line '$2' in $1:"; cat "$1"; return 1; }; }
is_empty() { [ ! -s "$1" ] || { echo "$1 is not empty:"; cat "$1"; return 1; }; }
exit_is() { # exit_is CODE COMMAND...: stdout in $TMP/out, stderr in $TMP/err
    want=$1
    shift
    "$@" >"$TMP/out" 2>"$TMP/err"
    got=$?
    [ "$got" -eq "$want" ] || { echo "exit status $got, want $want"; cat "$TMP/err"; return 1; }
}

# Prints the plan line and exits with the scripts' status.
tap_finish() {
    echo "1..$n"
    [ "$failed" -eq 0 ]
    exit $?
}
