#!/usr/bin/env python3
"""Summarise llama.cpp's vocabulary GGUFs with gguf-py, for rafter-gguf's tests.

    PYTHONPATH=$LLAMA_CPP/gguf-py python gen_vocab_summary.py $LLAMA_CPP/models \
        > fixtures/vocab_summary.json

$LLAMA_CPP is llama.cpp's source tree (vendor/llama.cpp of the llama-cpp-python 0.3.36
sdist); gguf-py needs numpy and pyyaml. For each models/ggml-vocab-*.gguf the summary
records what gguf-py's GGUFReader reports: version, alignment, data offset, tensors, and
every metadata key with its offset, type and value. Arrays (vocabularies of up to 262k
strings) are summarised by length, first and last elements and an FNV-1a 64 hash of all
elements, so the committed JSON stays small while still pinning every element. The Rust
test (tests/vocab_gguf_py.rs) recomputes the same hashes from rafter-gguf's view.

Hash encoding: strings are their UTF-8 bytes each followed by 0xFF (a byte that never
occurs in UTF-8); numbers are their little-endian encoding as the array's element type;
bools one byte 0/1.
"""

import json
import struct
import sys
from pathlib import Path

import gguf
from gguf import GGUFReader, GGUFValueType

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK = (1 << 64) - 1

PACK = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}

TYPE_NAMES = {
    GGUFValueType.UINT8: "u8",
    GGUFValueType.INT8: "i8",
    GGUFValueType.UINT16: "u16",
    GGUFValueType.INT16: "i16",
    GGUFValueType.UINT32: "u32",
    GGUFValueType.INT32: "i32",
    GGUFValueType.FLOAT32: "f32",
    GGUFValueType.BOOL: "bool",
    GGUFValueType.STRING: "str",
    GGUFValueType.ARRAY: "arr",
    GGUFValueType.UINT64: "u64",
    GGUFValueType.INT64: "i64",
    GGUFValueType.FLOAT64: "f64",
}

# Strings longer than this are summarised by length, prefix and hash instead of in full.
MAX_INLINE_STRING = 256


def fnv1a(data: bytes, h: int = FNV_OFFSET) -> int:
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK
    return h


def encode_elements(elem_type, values) -> bytes:
    if elem_type == GGUFValueType.STRING:
        return b"".join(v.encode("utf-8") + b"\xff" for v in values)
    fmt = PACK[elem_type]
    return b"".join(struct.pack(fmt, v) for v in values)


def json_scalar(value):
    # JSON has no NaN/inf; none occur in vocabulary files, fail loudly if one does.
    if isinstance(value, float) and value != value:
        raise ValueError("NaN in metadata")
    return value


def summarise_field(field) -> dict:
    main = field.types[0]
    out = {"key": field.name, "offset": int(field.offset), "type": TYPE_NAMES[main]}
    if main == GGUFValueType.ARRAY:
        if len(field.types) > 2:
            raise ValueError(f"{field.name}: nested arrays are not summarised")
        values = field.contents()
        elem = field.types[1] if len(field.types) > 1 else None
        out["elem_type"] = TYPE_NAMES[elem] if elem is not None else None
        out["len"] = len(values)
        out["first"] = [json_scalar(v) for v in values[:5]]
        out["last"] = [json_scalar(v) for v in values[-3:]]
        out["fnv1a64"] = "%016x" % fnv1a(encode_elements(elem, values)) if elem is not None else None
    elif main == GGUFValueType.STRING:
        value = field.contents()
        raw = value.encode("utf-8")
        out["len"] = len(raw)
        if len(value) <= MAX_INLINE_STRING:
            out["value"] = value
        else:
            out["prefix"] = value[:64]
        out["fnv1a64"] = "%016x" % fnv1a(raw)
    else:
        value = field.contents()
        if main == GGUFValueType.FLOAT32:
            # gguf-py decodes to a Python float holding the f32 exactly.
            out["value"] = float(value)
        else:
            out["value"] = json_scalar(value)
    return out


def summarise(path: Path) -> dict:
    reader = GGUFReader(path)
    data = path.read_bytes()
    fields = [f for name, f in reader.fields.items() if not name.startswith("GGUF.")]
    return {
        "file": path.name,
        "size": len(data),
        "fnv1a64": "%016x" % fnv1a(data),
        "version": int(reader.fields["GGUF.version"].contents()),
        "alignment": int(reader.alignment),
        "data_offset": int(reader.data_offset),
        "tensors": [
            {
                "name": t.name,
                "type": int(t.tensor_type),
                "dims": [int(d) for d in t.shape],
                "data_offset": int(t.data_offset),
                "n_bytes": int(t.n_bytes),
            }
            for t in reader.tensors
        ],
        "kv": [summarise_field(f) for f in fields],
    }


def main() -> None:
    models = Path(sys.argv[1])
    files = sorted(models.glob("ggml-vocab-*.gguf"))
    if not files:
        sys.exit(f"no ggml-vocab-*.gguf in {models}")
    summary = {
        "generator": "crates/rafter-gguf/tests/gen_vocab_summary.py",
        "gguf_py": "gguf-py of llama.cpp from the llama-cpp-python 0.3.36 sdist (vendor/llama.cpp/gguf-py)",
        "files": [summarise(f) for f in files],
    }
    json.dump(summary, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
