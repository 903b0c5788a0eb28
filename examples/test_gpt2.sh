#!/bin/sh
# The GPT-2 example end to end, as TAP, on a tiny model (2 layers, 2 heads, n_embd 32, block
# 32) trained on a source file's bytes: usage errors, the loss finite and decreasing (also
# with --dropout), --save
# then --init giving the same first loss, the same weights in Hugging Face's layout and in
# llm.c's .bin (written by python3 when there is one) giving it too, clear errors for bad
# files, sampling from one compiled graph, two ranks under mpiexec, MFU over the peak of the
# matmuls' dtype.
# Usage: test_gpt2.sh /path/to/gpt2 [/path/to/mpiexec HAVE_MPI]
set -u

if [ $# -ne 1 ] && [ $# -ne 3 ]; then
    echo "usage: $0 /path/to/gpt2 [/path/to/mpiexec HAVE_MPI]" >&2
    exit 2
fi
EX=$1
MPIEXEC=${2:-}
HAVE_MPI=${3:-0}
TEXT=$(dirname "$0")/gpt2_model.c
TMP=$(mktemp -d "${TMPDIR:-/tmp}/loom-gpt2-test.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM
echo "1..11"

n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
skip() { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }
not_ok() {
    n=$((n + 1))
    echo "not ok $n - $1"
    for f in "$2" "${3:-}"; do
        [ -n "$f" ] && [ -f "$f" ] && sed 's/^/# /' "$f"
    done
}
field() { sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" "$1" | tail -n 1; }
first_loss() { sed -n 's/^step=0 loss=\([^ ]*\).*/\1/p' "$1"; }
SMALL="--text $TEXT --n-layer 2 --n-head 2 --n-embd 32 --block-size 32 --seq-len 16 --batch-size 2"

# 1: usage errors exit 2 with a message
usage_case() {
    pattern=$1
    shift
    "$EX" "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    [ $rc -eq 2 ] && grep -q -- "$pattern" "$TMP/err" && return 0
    echo "# $* exited $rc" >>"$TMP/err"
    return 1
}
if usage_case "give one of --data" --max-steps 1 &&
    usage_case "init-layout must be auto, nanogpt or hf" $SMALL --init-layout tf &&
    usage_case "seq-len 64 exceeds the block size 32" $SMALL --seq-len 64 &&
    usage_case "n-head 3 must divide --n-embd 32" $SMALL --n-head 3 &&
    usage_case "prompt needs --text" --data x.bin --prompt hi &&
    usage_case "dropout needs a probability in \[0, 1)" $SMALL --dropout 1; then
    ok "usage errors exit 2 naming the problem"
else
    not_ok "usage errors exit 2 naming the problem" "$TMP/err"
fi

# 2: five steps: every loss finite, the last below the first
"$EX" $SMALL --max-steps 5 --lr 2e-3 --json >"$TMP/train" 2>"$TMP/train.err"
rc=$?
L0=$(first_loss "$TMP/train")
L4=$(sed -n 's/^step=4 loss=\([^ ]*\).*/\1/p' "$TMP/train")
if [ $rc -eq 0 ] && [ "$(grep -c '^step=[0-9]* loss=[0-9.]* ' "$TMP/train")" -eq 5 ] &&
    awk -v a="$L0" -v b="$L4" 'BEGIN { exit !(a > 5 && a < 6 && b < a - 0.01) }'; then
    ok "the loss is finite and decreases ($L0 -> $L4)"
else
    not_ok "the loss is finite and decreases ($L0 -> $L4)" "$TMP/train" "$TMP/train.err"
fi

# 3: --dropout 0.1 (inside the fused attention too): other losses, finite and decreasing
"$EX" $SMALL --max-steps 5 --lr 2e-3 --dropout 0.1 >"$TMP/drop" 2>"$TMP/drop.err"
rc=$?
D0=$(first_loss "$TMP/drop")
D4=$(sed -n 's/^step=4 loss=\([^ ]*\).*/\1/p' "$TMP/drop")
if [ $rc -eq 0 ] && [ "$(grep -c '^step=[0-9]* loss=[0-9.]* ' "$TMP/drop")" -eq 5 ] &&
    awk -v a="$D0" -v b="$D4" -v z="$L0" 'BEGIN { exit !(a > 5 && a < 6 && b < a - 0.01 && a != z) }'; then
    ok "--dropout 0.1 trains ($D0 -> $D4; without: $L0)"
else
    not_ok "--dropout 0.1 trains ($D0 -> $D4; without: $L0)" "$TMP/drop" "$TMP/drop.err"
fi

# 4: --save the initial weights (lr 0), --init them under another seed: the same first loss
"$EX" $SMALL --max-steps 1 --lr 0 --save "$TMP/w.safetensors" >"$TMP/save" 2>&1
"$EX" $SMALL --max-steps 2 --seed 7 --init "$TMP/w.safetensors" >"$TMP/init" 2>&1
rc=$?
"$EX" $SMALL --max-steps 1 --seed 7 >"$TMP/seed7" 2>&1
A=$(first_loss "$TMP/save")
B=$(first_loss "$TMP/init")
C=$(first_loss "$TMP/seed7")
if [ $rc -eq 0 ] && [ -n "$A" ] && [ "$A" = "$B" ] && [ "$A" != "$C" ]; then
    ok "--init of a --save file gives its first loss ($A; seed 7 alone: $C)"
else
    not_ok "--init of a --save file gives its first loss ($A, $B; seed 7 alone: $C)" \
        "$TMP/save" "$TMP/init"
fi

# 5: the same weights as Hugging Face's model.safetensors and as llm.c's gpt2_124M.bin
if command -v python3 >/dev/null 2>&1; then
    python3 - "$TMP/w.safetensors" "$TMP/hf.safetensors" "$TMP/llmc.bin" <<'EOF'
import array, json, struct, sys
src, hf_path, llmc_path = sys.argv[1:]
raw = open(src, 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
head = json.loads(raw[8:8 + n])
t = {}
for k, v in head.items():
    if k != '__metadata__':
        b, e = v['data_offsets']
        t[k] = (v['shape'], array.array('f', raw[8 + n + b:8 + n + e]))
def transpose(shape, a):
    r, c = shape
    return [c, r], array.array('f', [a[i * c + j] for j in range(c) for i in range(r)])
out = {}
for k, (shape, a) in t.items():
    if k == 'lm_head.weight':
        continue
    k = k[len('transformer.'):]
    if any(k.endswith(s) for s in ('c_attn.weight', 'c_proj.weight', 'c_fc.weight')):
        shape, a = transpose(shape, a)
    out[k] = (shape, a)
L = 1 + max(int(k.split('.')[1]) for k in out if k.startswith('h.'))
T = out['wpe.weight'][0][0]
for l in range(L):  # HF's causal-mask buffer, to be ignored
    out['h.%d.attn.bias' % l] = ([1, 1, T, T], array.array('f', [1.0] * (T * T)))
hdr, blob = {}, b''
for k in sorted(out):
    shape, a = out[k]
    hdr[k] = {'dtype': 'F32', 'shape': shape, 'data_offsets': [len(blob), len(blob) + 4 * len(a)]}
    blob += a.tobytes()
h = json.dumps(hdr).encode()
h += b' ' * (-len(h) % 8)
open(hf_path, 'wb').write(struct.pack('<Q', len(h)) + h + blob)
V, C = t['transformer.wte.weight'][0]
Vp = V + 7  # padded rows, as llm.c's 50304
p = lambda name: t['transformer.' + name][1]
body = p('wte.weight').tobytes() + b'\0' * (4 * C * (Vp - V)) + p('wpe.weight').tobytes()
for s in ('ln_1.weight', 'ln_1.bias', 'attn.c_attn.weight', 'attn.c_attn.bias',
          'attn.c_proj.weight', 'attn.c_proj.bias', 'ln_2.weight', 'ln_2.bias',
          'mlp.c_fc.weight', 'mlp.c_fc.bias', 'mlp.c_proj.weight', 'mlp.c_proj.bias'):
    body += b''.join(p('h.%d.%s' % (l, s)).tobytes() for l in range(L))
body += p('ln_f.weight').tobytes() + p('ln_f.bias').tobytes()
header = [20240326, 3, T, V, L, 2, C, Vp] + [0] * 248
open(llmc_path, 'wb').write(struct.pack('<256i', *header) + body)
EOF
    "$EX" $SMALL --max-steps 1 --seed 7 --init "$TMP/hf.safetensors" >"$TMP/hf" 2>&1
    rc1=$?
    "$EX" $SMALL --max-steps 1 --seed 7 --init-llmc "$TMP/llmc.bin" >"$TMP/llmc" 2>&1
    rc2=$?
    H=$(first_loss "$TMP/hf")
    M=$(first_loss "$TMP/llmc")
    if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ "$H" = "$A" ] && [ "$M" = "$A" ]; then
        ok "Hugging Face and llm.c files of the same weights give the same first loss ($A)"
    else
        not_ok "Hugging Face and llm.c files give the same first loss ($A: hf $H, llm.c $M)" \
            "$TMP/hf" "$TMP/llmc"
    fi
else
    skip "Hugging Face and llm.c files give the same first loss" "no python3"
fi

# 6: bad files are errors (exit 1) that say what is wrong
bad_case() {
    pattern=$1
    shift
    "$EX" "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    [ $rc -eq 1 ] && grep -q -- "$pattern" "$TMP/err" && return 0
    echo "# $* exited $rc" >>"$TMP/err"
    return 1
}
printf 'not a token file, far too short' >"$TMP/bad.bin"
head -c 1100 "$TMP/w.safetensors" >"$TMP/trunc.safetensors"
if bad_case "shorter than llm.c's 1024-byte header" --data "$TMP/bad.bin" &&
    bad_case "bad magic" $SMALL --init-llmc "$TMP/w.safetensors" &&
    bad_case "truncated" $SMALL --init "$TMP/trunc.safetensors"; then
    ok "bad files exit 1 naming the fault"
else
    not_ok "bad files exit 1 naming the fault" "$TMP/err"
fi
if [ -f "$TMP/llmc.bin" ]; then
    head -c 5000 "$TMP/llmc.bin" >"$TMP/trunc.bin"
    if bad_case "truncated: 5000 bytes" $SMALL --init-llmc "$TMP/trunc.bin"; then
        ok "a truncated llm.c file is an error"
    else
        not_ok "a truncated llm.c file is an error" "$TMP/err"
    fi
else
    skip "a truncated llm.c file is an error" "no python3"
fi

# 7: a shape that does not fit is named with both shapes, as are given sizes the file lacks
if command -v python3 >/dev/null 2>&1; then
    python3 - "$TMP/w.safetensors" "$TMP/shape.safetensors" "$TMP/other.safetensors" <<'EOF'
import json, struct, sys
raw = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
head = json.loads(raw[8:8 + n])
# c_fc's bias [128] read as [64, 2]: same bytes, another shape
head['transformer.h.1.mlp.c_fc.bias']['shape'] = [64, 2]
h = json.dumps(head).encode()
h += b' ' * (-len(h) % 8)
open(sys.argv[2], 'wb').write(struct.pack('<Q', len(h)) + h + raw[8 + n:])
head = json.loads(raw[8:8 + n])
head['embed.weight'] = head.pop('transformer.wte.weight')
h = json.dumps(head).encode()
h += b' ' * (-len(h) % 8)
open(sys.argv[3], 'wb').write(struct.pack('<Q', len(h)) + h + raw[8 + n:])
EOF
    if bad_case "n-embd is 32 in the file ('wte.weight'), 64 given" \
        --text "$TEXT" --n-embd 64 --n-head 2 --init "$TMP/w.safetensors" &&
        bad_case "not a GPT-2 checkpoint" $SMALL --init "$TMP/other.safetensors" &&
        bad_case "tensor 'transformer.h.1.mlp.c_fc.bias' has shape \[64, 2\], the model needs \[128\]" \
        $SMALL --init "$TMP/shape.safetensors"; then
        ok "a shape mismatch names the tensor and both shapes"
    else
        not_ok "a shape mismatch names the tensor and both shapes" "$TMP/err"
    fi
else
    skip "a shape mismatch names the tensor and both shapes" "no python3"
fi

# 8: sampling: 20 tokens from one compiled graph
"$EX" $SMALL --max-steps 3 --sample 20 --prompt "int " --top-k 5 --json >"$TMP/sample" 2>&1
rc=$?
if [ $rc -eq 0 ] && [ "$(field "$TMP/sample" sample_tokens)" = 20 ] &&
    [ "$(field "$TMP/sample" sample_compiles)" = 1 ] && [ "$(field "$TMP/sample" recompiles)" = 0 ] &&
    grep -q '^sample: int ' "$TMP/sample"; then
    ok "--sample 20 compiles one graph for all the tokens"
else
    not_ok "--sample 20 compiles one graph for all the tokens" "$TMP/sample"
fi

# 9: MFU is taken over the measured GEMM peak of the forward's matmul dtype: f32 without
# autocast (the run of check 2), bf16 under --amp bf16 (whichever path its matmuls take)
"$EX" $SMALL --max-steps 3 --amp bf16 --json >"$TMP/bf16" 2>"$TMP/bf16.err"
rc=$?
if [ $rc -eq 0 ] && [ "$(field "$TMP/train" peak_dtype)" = '"f32"' ] &&
    [ "$(field "$TMP/bf16" peak_dtype)" = '"bf16"' ] &&
    awk -v a="$(field "$TMP/train" mfu)" -v b="$(field "$TMP/bf16" mfu)" \
        -v p="$(field "$TMP/bf16" peak_flops)" 'BEGIN { exit !(a > 0 && a < 1 && b > 0 && b < 1 && p > 1e9) }'; then
    ok "MFU over the f32 peak in fp32, over the bf16 peak under --amp bf16"
else
    not_ok "MFU over the f32 peak in fp32, over the bf16 peak under --amp bf16" "$TMP/bf16" "$TMP/bf16.err"
fi

# 10: two ranks sharing the global batch log the losses of one process
if [ "$HAVE_MPI" = 1 ] && [ -n "$MPIEXEC" ]; then
    "$EX" $SMALL --batch-size 4 --max-steps 3 >"$TMP/one" 2>&1
    "$MPIEXEC" -n 2 "$EX" $SMALL --batch-size 4 --max-steps 3 >"$TMP/two" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && awk 'NR == FNR && /^step=/ { split($2, a, "="); l[$1] = a[2]; next }
        /^step=/ { split($2, b, "="); c++; d = b[2] - l[$1]; if (d < 0) d = -d; if (d > 1e-5) bad = 1 }
        END { exit bad || c != 3 }' "$TMP/one" "$TMP/two"; then
        ok "mpiexec -n 2 logs the losses of one process"
    else
        not_ok "mpiexec -n 2 logs the losses of one process" "$TMP/one" "$TMP/two"
    fi
else
    skip "mpiexec -n 2 logs the losses of one process" "no MPI or mpiexec"
fi
