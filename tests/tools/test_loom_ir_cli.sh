#!/bin/sh
# Tests of `loom-ir diff` (exit status, golden output, stdin, bad files) and of the
# conventions every loom-ir command follows (--help, '-' as stdin, exit 2 with a one-line
# usage on usage errors), as TAP. The command list comes from `loom-ir --help`, so a new
# command is checked without editing this script.
# Usage: test_loom_ir_cli.sh /path/to/loom-ir /path/to/tests/data
set -u

if [ $# -ne 2 ]; then
    echo "usage: $0 /path/to/loom-ir /path/to/tests/data" >&2
    exit 2
fi
LOOM_IR=$1
DATA=$2
. "$(dirname "$0")/tap_lib.sh"

# ---- diff: two steps of a training loop --------------------------------------------------
cat >"$TMP/a.loom" <<'LOOM'
// step 11 of a training loop: a linear layer, a loss, an SGD update
loom.graph {
  %x = input {index = 0} : f32[64,784] loc("/home/u/train.c":80)
  %w = input {index = 1} : f32[784,10] loc("/home/u/train.c":70)
  %y = input {index = 2} : f32[64,10] loc("/home/u/train.c":81)
  %h = matmul %x, %w : f32[64,10] loc("/home/u/train.c":88)
  %d = sub %h, %y : f32[64,10] loc("/home/u/train.c":90)
  %l = reduce_mean %d {axes = [0, 1], keepdim = false} : f32[] loc("/home/u/train.c":91)
  %lr = constant {value = 0.01} : f32[] loc("/home/u/train.c":95)
  %lrb = broadcast %lr : f32[784,10] loc("/home/u/train.c":95)
  %u = mul %w, %lrb : f32[784,10] loc("/home/u/train.c":96)
  %w2 = sub %w, %u : f32[784,10] loc("/home/u/train.c":96)
  return %l, %w2 {alias = 1}
}
LOOM
# step 12: the last, smaller batch; the learning rate baked in as a constant; a relu added
sed -e 's/f32\[64,/f32[63,/g' -e 's/value = 0.01/value = 0.0099/' \
    -e 's|^  %d = sub %h|  %r = relu %h : f32[63,10] loc("/home/u/train.c":89)\n  %d = sub %r|' \
    "$TMP/a.loom" >"$TMP/b.loom"
cat >"$TMP/want_ab" <<'EOF2'
%0 input 0 at train.c:80 has f32[63,784] (was f32[64,784])
%2 input 2 at train.c:81 has f32[63,10] (was f32[64,10])
%4 relu at train.c:89 is new: f32[63,10]
%7 constant at train.c:95 is a constant that changes between graphs: value = 0.0099 (was value = 0.01)
%3 matmul at train.c:88 has f32[63,10] (was f32[64,10], following the changes above)
%5 sub at train.c:90 has f32[63,10] (was f32[64,10], following the changes above)
EOF2
# the same graph written by the printer: other layout, other names, same structure
"$LOOM_IR" print "$TMP/a.loom" >"$TMP/a_printed.loom"

check "diff of a file with itself exits 0" exit_is 0 "$LOOM_IR" diff "$TMP/a.loom" "$TMP/a.loom"
check "diff of equal graphs prints nothing" is_empty "$TMP/out"
check "diff ignores layout and value names" \
    exit_is 0 "$LOOM_IR" diff "$TMP/a.loom" "$TMP/a_printed.loom"
check "diff of different graphs exits 1" exit_is 1 "$LOOM_IR" diff "$TMP/a.loom" "$TMP/b.loom"
check "diff lists each difference with its file:line" same_file "$TMP/want_ab" "$TMP/out"
check "diff writes nothing on stderr when graphs differ" is_empty "$TMP/err"
check "diff reads the first graph from stdin" \
    exit_is 1 sh -c '"$1" diff - "$2" <"$3"' sh "$LOOM_IR" "$TMP/b.loom" "$TMP/a.loom"
check "diff from stdin prints the same" same_file "$TMP/want_ab" "$TMP/out"
check "diff reads the second graph from stdin" \
    exit_is 1 sh -c '"$1" diff "$2" - <"$3"' sh "$LOOM_IR" "$TMP/a.loom" "$TMP/b.loom"
check "diff from stdin (second) prints the same" same_file "$TMP/want_ab" "$TMP/out"
check "diff --max=2 exits 1" exit_is 1 "$LOOM_IR" diff --max=2 "$TMP/a.loom" "$TMP/b.loom"
{ head -n 2 "$TMP/want_ab" && echo "... and 4 more differences"; } >"$TMP/want_max2"
check "diff --max=2 prints two differences and a count of the rest" \
    same_file "$TMP/want_max2" "$TMP/out"
check "diff --max 0 (separate value) prints only the count" \
    exit_is 1 "$LOOM_IR" diff --max 0 "$TMP/a.loom" "$TMP/b.loom"
check "the count line" has_line "$TMP/out" "... and 6 more differences"
check "diff the other way lists the relu as removed" \
    exit_is 1 "$LOOM_IR" diff "$TMP/b.loom" "$TMP/a.loom"
check "a removed node carries the first graph's id" has_line "$TMP/out" \
    "%4 relu at train.c:89 was removed: f32[63,10] (an id of the first graph)"

# ---- diff: trouble is exit 2 -------------------------------------------------------------
check "diff with an invalid first file exits 2" \
    exit_is 2 "$LOOM_IR" diff "$DATA/bad_undefined.loom" "$TMP/a.loom"
check "diff names the invalid file, line and column" \
    has_line "$TMP/err" "$DATA/bad_undefined.loom:3:16: error: undefined value '%2'"
check "diff with an invalid second file exits 2" \
    exit_is 2 "$LOOM_IR" diff "$TMP/a.loom" "$DATA/bad_alias.loom"
check "diff names the second file" has_line "$TMP/err" \
    "$DATA/bad_alias.loom: error: %1: output of type f32[3] cannot be written into f32[2,3]"
check "diff with a missing file exits 2" \
    exit_is 2 "$LOOM_IR" diff "$TMP/a.loom" "$TMP/nope.loom"
check "diff names the missing file" \
    has_line "$TMP/err" "$TMP/nope.loom: error: cannot open: No such file or directory"
check "diff of stdin with itself is a usage error" exit_is 2 "$LOOM_IR" diff - - </dev/null
check "... saying why" first_line_is "$TMP/err" "loom-ir: diff: only one FILE may be '-'"
check "diff with one FILE exits 2" exit_is 2 "$LOOM_IR" diff "$TMP/a.loom"
check "... naming what is missing" first_line_is "$TMP/err" "loom-ir: diff: missing FILE"
check "diff with three FILEs exits 2" exit_is 2 "$LOOM_IR" diff "$TMP/a.loom" "$TMP/a.loom" x
check "diff --max=x exits 2" exit_is 2 "$LOOM_IR" diff --max=x "$TMP/a.loom" "$TMP/b.loom"
check "... naming the bad count" first_line_is "$TMP/err" "loom-ir: diff: --max needs a count, not 'x'"
check "diff --max without a value exits 2" exit_is 2 "$LOOM_IR" diff "$TMP/a.loom" "$TMP/b.loom" --max

# ---- every command: --help, usage errors, stdin ------------------------------------------
"$LOOM_IR" --help >"$TMP/help" 2>&1
commands=$(sed -n 's/^  \([a-z][a-z]*\) .*/\1/p' "$TMP/help")
check "--help lists diff among the commands" has_line "$TMP/help" "  diff [--max=N] A B"
check "--help lists at least 8 commands" [ "$(echo "$commands" | wc -w)" -ge 8 ]
for c in $commands; do
    check "$c --help exits 0" exit_is 0 "$LOOM_IR" "$c" --help
    check "$c --help prints its usage on stdout" grep -q "^usage: loom-ir $c" "$TMP/out"
    check "$c --help writes nothing on stderr" is_empty "$TMP/err"
    "$LOOM_IR" help "$c" >"$TMP/help_$c" 2>&1
    check "help $c is $c --help" same_file "$TMP/out" "$TMP/help_$c"
    check "$c with an unknown option exits 2" exit_is 2 "$LOOM_IR" "$c" --frobnicate "$DATA/mlp.loom"
    check "$c names the unknown option" \
        first_line_is "$TMP/err" "loom-ir: $c: unknown option '--frobnicate'"
    check "$c follows it with its one-line usage" \
        grep -q "^usage: loom-ir $c " "$TMP/err"
    check "$c's usage error is two lines" [ "$(wc -l <"$TMP/err")" -eq 2 ]
    check "$c's usage error writes nothing on stdout" is_empty "$TMP/out"
    if grep -qE "^usage: loom-ir $c .*(FILE| A B$)" "$TMP/help_$c"; then # takes operands (ops: none)
        check "$c without arguments exits 2" exit_is 2 "$LOOM_IR" "$c"
        check "$c without arguments shows its usage" grep -q "^usage: loom-ir $c " "$TMP/err"
    fi
done

# '-' is stdin for every command that takes a FILE (opt with a pass list; diff above)
for c in print verify stats dot hash plan; do
    "$LOOM_IR" "$c" "$DATA/mlp.loom" >"$TMP/$c.file" 2>&1
    check "$c FILE prints something" [ -s "$TMP/$c.file" ]
    check "$c - exits 0" exit_is 0 sh -c '"$1" "$2" - <"$3"' sh "$LOOM_IR" "$c" "$DATA/mlp.loom"
    if [ "$c" = verify ]; then
        check "verify - names <stdin>" has_line "$TMP/out" "<stdin>: ok: 13 nodes, 5 inputs, 2 outputs"
    else
        check "$c - prints what $c FILE prints" same_file "$TMP/$c.file" "$TMP/out"
    fi
done
"$LOOM_IR" opt --passes=dce,cse "$DATA/mlp.loom" >"$TMP/opt.file" 2>&1
check "opt FILE prints something" [ -s "$TMP/opt.file" ]
check "opt --passes LIST - (separate value, stdin) exits 0" \
    exit_is 0 sh -c '"$1" opt --passes dce,cse - <"$2"' sh "$LOOM_IR" "$DATA/mlp.loom"
check "opt from stdin prints what opt FILE prints" same_file "$TMP/opt.file" "$TMP/out"
check "opt --passes without a value exits 2" exit_is 2 "$LOOM_IR" opt "$DATA/mlp.loom" --passes
check "opt without --passes exits 2" exit_is 2 "$LOOM_IR" opt "$DATA/mlp.loom"
check "... naming what is missing" first_line_is "$TMP/err" "loom-ir: opt: missing --passes=LIST"
check "opt with an unknown pass exits 2" exit_is 2 "$LOOM_IR" opt --passes=nope "$DATA/mlp.loom"
check "... naming the pass" grep -q "^loom-ir: opt: unknown pass 'nope'; known passes: " "$TMP/err"
check "-- ends the options: a file named --help" exit_is 1 "$LOOM_IR" print -- --help
check "... is read as a file" has_line "$TMP/err" "--help: error: cannot open: No such file or directory"
check "help of an unknown command exits 2" exit_is 2 "$LOOM_IR" help frobnicate

# ---- every non-zero exit says why -------------------------------------------------------------
# A graph whose input cannot be allocated (4 TB): `run` once exited 1 with no message.
cat >"$TMP/huge.loom" <<'END'
loom.graph {
  %x = input {index = 0} : f32[1000000,1000000]
  %y = neg %x : f32[1000000,1000000]
  return %y
}
END
says_why() { # says_why COMMAND...: a non-zero exit with an error or usage line on stderr
    "$@" >"$TMP/out" 2>"$TMP/err"
    got=$?
    [ "$got" -ne 0 ] || { echo "exit status 0"; return 1; }
    grep -q "error\|usage" "$TMP/err" || { echo "exit $got with stderr:"; cat "$TMP/err"; return 1; }
}
check "run of an input past memory says so" says_why "$LOOM_IR" run "$TMP/huge.loom"
check "... naming the input and its size" \
    grep -q "error: out of memory for input 0 (4000000000000 bytes)" "$TMP/err"
check "run --check of it too" says_why "$LOOM_IR" run --check "$TMP/huge.loom"
check "run --repeat=0" says_why "$LOOM_IR" run --repeat=0 "$DATA/mlp.loom"
check "compile --emit=nope" says_why "$LOOM_IR" compile --emit=nope "$DATA/mlp.loom"
check "ops --op=nope" says_why "$LOOM_IR" ops --op=nope
for c in print verify stats dot hash plan; do
    check "$c into a full disk" says_why sh -c '"$1" "$2" "$3" >/dev/full' sh "$LOOM_IR" "$c" \
        "$DATA/mlp.loom"
done
check "compile --emit=plan into a full disk" \
    says_why sh -c '"$1" compile --emit=plan "$2" >/dev/full' sh "$LOOM_IR" "$DATA/mlp.loom"

tap_finish
