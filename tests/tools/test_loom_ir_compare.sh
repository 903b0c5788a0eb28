#!/bin/sh
# Tests of `loom-ir compare` on safetensors files written here (python3's standard library,
# which meson itself needs): identical dumps pass, a perturbed one fails at the right tensor
# (the first in graph order, not in name order), node ids that differ between the dumps still
# pair by scope and op, tensors in one file only and different shapes fail, --rules, --json
# and --html, and bad files and options are errors. As TAP.
# Usage: test_loom_ir_compare.sh /path/to/loom-ir
set -u

if [ $# -ne 1 ]; then
    echo "usage: $0 /path/to/loom-ir" >&2
    exit 2
fi
LOOM_IR=$1
. "$(dirname "$0")/tap_lib.sh"
PY=$(command -v python3 || echo /usr/bin/python3)

# write FILE NAME=DTYPE:SHAPE:VALUES... (VALUES comma-separated, SHAPE x-separated)
write() {
    "$PY" - "$@" <<'PYEOF'
import json, struct, sys
path, specs = sys.argv[1], sys.argv[2:]
header, blobs, off = {}, [], 0
for spec in specs:
    name, rest = spec.split('=', 1)
    dt, shape, vals = rest.split(':')
    vals = [float(v) for v in vals.split(',')]
    if dt == 'F32':
        data = struct.pack('<%df' % len(vals), *vals)
    else:  # BF16: the top half of the f32
        data = b''.join(struct.pack('<f', v)[2:] for v in vals)
    header[name] = {'dtype': dt, 'shape': [int(s) for s in shape.split('x')],
                    'data_offsets': [off, off + len(data)]}
    blobs.append(data)
    off += len(data)
h = json.dumps(header).encode()
h += b' ' * (-len(h) % 8)
with open(path, 'wb') as f:
    f.write(struct.pack('<Q', len(h)) + h + b''.join(blobs))
PYEOF
}

# graph order: input %0, relu %2, fc1.matmul %3, fc1.add %9 (name order: fc1.add first)
BASE="input.%0=F32:4:1,2,3,4 relu.%2=F32:4:0,2,0,4 fc1.matmul.%3=F32:2x2:1,-1,0.5,2"
write "$TMP/a.st" $BASE "fc1.add.%9=F32:4:1.5,-0.5,1,2.5"
check "identical dumps exit 0" exit_is 0 "$LOOM_IR" compare "$TMP/a.st" "$TMP/a.st"
check "... every tensor passes" grep -q "^4 tensors compared, 0 failing$" "$TMP/out"
check "... in graph order" sh -c "grep -o '[a-z0-9.]*%[0-9]*\$' '$TMP/out' | tr '\n' ' ' | grep -qx 'input.%0 relu.%2 fc1.matmul.%3 fc1.add.%9 '"
check "... with cosine 1 and errors 0" grep -qE "^pass +f32 / f32 +4 +1.000000 +0.000e\+00 +0.000e\+00 +0.000e\+00  fc1.add.%9$" "$TMP/out"

write "$TMP/b.st" "input.%0=F32:4:1,2,3,4" "relu.%2=F32:4:0,2,0,-4" \
    "fc1.matmul.%3=F32:2x2:1,-1,0.5,2" "fc1.add.%9=F32:4:1.5,-0.5,1,9"
check "a perturbed dump exits 1" exit_is 1 "$LOOM_IR" compare "$TMP/a.st" "$TMP/b.st"
check "... the first failure is relu.%2, the first in graph order" \
    grep -q "^FAIL .*  relu.%2   <- the first failure$" "$TMP/out"
check "... with its max abs error 8" grep -qE "^FAIL +f32 / f32 +4 +-0.600000 +8.000e\+00 .* relu.%2 " "$TMP/out"
check "... fc1.add.%9 fails too, unmarked" grep -qE "^FAIL .*  fc1.add.%9$" "$TMP/out"
check "... the matmul passes" grep -qE "^pass .*  fc1.matmul.%3$" "$TMP/out"
check "... summary" grep -q "^4 tensors compared, 2 failing; the first in graph order: relu.%2$" "$TMP/out"

check "looser --rules pass it" exit_is 0 "$LOOM_IR" compare --rules=cos=-1,abs=10,cos_fail=-1,abs_fail=10 "$TMP/a.st" "$TMP/b.st"
check "a bad rule is a usage error" exit_is 2 "$LOOM_IR" compare --rules=cosine=1 "$TMP/a.st" "$TMP/b.st"
check "... naming it" grep -q "unknown rule 'cosine'" "$TMP/err"

check "--json" exit_is 1 "$LOOM_IR" compare --json "$TMP/a.st" "$TMP/b.st"
check "... is JSON naming the first failure and each tensor's verdict" "$PY" -c "
import json, sys
j = json.load(open('$TMP/out'))
assert j['first_failure'] == 'relu.%2' and j['failed'] == 2, j
v = {t['name']: t['pass'] for t in j['tensors']}
assert v == {'input.%0': True, 'relu.%2': False, 'fc1.matmul.%3': True, 'fc1.add.%9': False}, v
assert abs([t for t in j['tensors'] if t['name'] == 'relu.%2'][0]['max_abs'] - 8) < 1e-12
"
check "--html writes a page" exit_is 1 "$LOOM_IR" compare --html="$TMP/c.html" "$TMP/a.st" "$TMP/b.st"
check "... with the first failure's row highlighted" grep -q '<tr class="fail first"><td class="n">1</td><td>relu.%2</td>' "$TMP/c.html"
check "... sortable" grep -q "querySelectorAll('#t th')" "$TMP/c.html"

# ids that differ (another graph of the same model), a bf16 side, a missing tensor, a shape
write "$TMP/d.st" "input.%0=BF16:4:1,2,3,4" "relu.%5=F32:4:0,2,0,4" \
    "fc1.matmul.%7=F32:4:1,-1,0.5,2" "fc1.sub.%12=F32:1:0"
check "renumbered dumps pair by scope and op" exit_is 1 "$LOOM_IR" compare "$TMP/a.st" "$TMP/d.st"
check "... relu.%2 with relu.%5" grep -qE "^pass +f32 / f32 +4 .*  relu.%2$" "$TMP/out"
check "... f32 against bf16" grep -qE "^pass +f32 / bf16 +4 .*  input.%0$" "$TMP/out"
check "... shapes that differ fail" grep -qE "^FAIL .*the shapes differ  fc1.matmul.%3" "$TMP/out"
check "... a tensor of A only" grep -qE "^FAIL .*only in A  fc1.add.%9$" "$TMP/out"
check "... and of B only" grep -qE "^FAIL .*only in B  fc1.sub.%12$" "$TMP/out"

printf 'not a dump' >"$TMP/bad.st"
check "an invalid file exits 2" exit_is 2 "$LOOM_IR" compare "$TMP/a.st" "$TMP/bad.st"
check "... naming it" grep -q "bad.st" "$TMP/err"
check "a missing file exits 2" exit_is 2 "$LOOM_IR" compare "$TMP/nope.st" "$TMP/a.st"
check "one FILE is a usage error" exit_is 2 "$LOOM_IR" compare "$TMP/a.st"
tap_finish
