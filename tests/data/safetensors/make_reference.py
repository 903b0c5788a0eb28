#!/usr/bin/env python3
r"""Writes the fuzz seeds and test files of this folder.

reference.safetensors: laid out exactly as the reference writer (the `safetensors` package's
Rust core, behind `safetensors.torch.save_file(tensors, path, metadata={"format": "pt"})`, as
`transformers` calls it) lays a file out, using only the standard library so it runs anywhere:

  - tensors ordered by dtype, widest first (the Rust Dtype enum order, descending), then name,
    so the keys are NOT in name order;
  - compact JSON (serde_json: no spaces), "__metadata__" first;
  - the header padded with spaces to a multiple of 8 bytes;
  - data packed in that order, little-endian.

The values are fixed here and asserted by tests/frontend/test_safetensors.c
(test_a_file_laid_out_by_the_reference_writer_loads).

hand.safetensors: what a hand-rolled writer might produce (the same bytes that
test_a_hand_written_file_with_spaces_escapes_and_no_padding_parses builds in memory): spaces
and newlines in the JSON, keys in any order, \u escapes with a surrogate pair, metadata last,
an unpadded header so the data is unaligned. A fuzz seed.

Rerun after changing them:
    python3 tests/data/safetensors/make_reference.py
"""
import json
import os
import struct


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bf16(xs):  # these values are exact in bf16: truncation is rounding
    return b"".join(struct.pack("<H", f32_bits(x) >> 16) for x in xs)


TENSORS = {  # name: (dtype, shape, bytes)
    "model.embed.weight": ("F32", [3, 2], struct.pack("<6f", 0.5, -1.0, 2.0, 3.25, -0.0, 1e-3)),
    "model.mask": ("BOOL", [4], bytes([1, 0, 0, 1])),
    "model.steps": ("I64", [], struct.pack("<q", 1234567890123)),
    "half": ("F16", [2], struct.pack("<2e", 1.5, -65504.0)),
    "brain": ("BF16", [2], bf16([1.0, -3.5])),
    "count": ("I32", [2], struct.pack("<2i", -7, 2147483647)),
    "x.f64": ("F64", [1], struct.pack("<d", 0.1)),
    "empty": ("F32", [0, 4], b""),
}

# safetensors' Rust `Dtype` declaration order (Ord is derived from it).
RUST_ORDER = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32",
              "U32", "F32", "F64", "I64", "U64"]


def main():
    names = sorted(TENSORS, key=lambda n: (-RUST_ORDER.index(TENSORS[n][0]), n))
    header = {"__metadata__": {"format": "pt"}}
    data = b""
    for n in names:
        dtype, shape, raw = TENSORS[n]
        header[n] = {"dtype": dtype, "shape": shape,
                     "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference.safetensors")
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)

    hand = ('{ "w" : {"shape" : [2], "data_offsets": [4, 12], "dtype": "F32"},\n'
            '  "caf\\u00e9\\ud83d\\ude00": {"dtype": "I32", "data_offsets": [0, 4], "shape": []},\n'
            '  "__metadata__": {"source": "hand \\"made\\"\\n\\t", "format": "pt"} }   ').encode()
    with open(os.path.join(os.path.dirname(out), "hand.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hand)) + hand + struct.pack("<i2f", -2, 1.0, 3.0))


if __name__ == "__main__":
    main()
