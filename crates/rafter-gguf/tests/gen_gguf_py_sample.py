#!/usr/bin/env python3
"""Write a small GGUF with gguf-py's GGUFWriter, and summarise it with its GGUFReader.

    cd crates/rafter-gguf/tests
    PYTHONPATH=$LLAMA_CPP/gguf-py python gen_gguf_py_sample.py fixtures

writes fixtures/gguf_py_sample.gguf (a few KB, committed) and fixtures/gguf_py_sample.json.
The file exercises what the vocabulary files do not: every scalar type, bool and numeric
arrays, a nested array, a non-default alignment (64), and tensors of several ggml types
(f32, f16, i8, i32, q8_0 made by gguf-py's quantizer, q4_K as raw blocks) with their
offsets and data. tests/gguf_py_sample.rs checks rafter-gguf reads the same. Deterministic:
numpy's seeded generator, no timestamps.
"""

import json
import sys
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from gen_vocab_summary import fnv1a, summarise_field


def write_sample(path: Path) -> None:
    rng = np.random.default_rng(25)
    w = GGUFWriter(path, arch="llama")
    w.add_custom_alignment(64)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4_000_000_000)
    w.add_int32("test.i32", -2_000_000_000)
    w.add_uint64("test.u64", 18_000_000_000_000_000_000)
    w.add_int64("test.i64", -9_000_000_000_000_000_000)
    w.add_float32("test.f32", 0.1)
    w.add_float64("test.f64", -1.25e-300)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "héllo, 世界 🌍")
    w.add_array("test.str_array", ["a", "", "ü", "<0x0A>", "Ġthe"])
    w.add_array("test.i32_array", [1, -2, 3, 2**31 - 1])
    w.add_array("test.f32_array", [0.5, -1.5, 3.25])
    w.add_array("test.bool_array", [True, False, True])
    w.add_key_value("test.nested", [[1, 2, 3], [4]], gguf.GGUFValueType.ARRAY)

    w.add_tensor("f32_3x5", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16_7", rng.standard_normal(7).astype(np.float16))
    w.add_tensor("i8_2x2x2", rng.integers(-128, 127, (2, 2, 2)).astype(np.int8))
    w.add_tensor("i32_4", np.arange(4, dtype=np.int32))
    q8 = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), GGMLQuantizationType.Q8_0)
    w.add_tensor("q8_0_2x64", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    # q4_K blocks: 144 bytes per 256 elements; random bytes are a valid container payload.
    q4k = rng.integers(0, 256, (2, 144)).astype(np.uint8)
    w.add_tensor("q4_K_2x256", q4k, raw_dtype=GGMLQuantizationType.Q4_K)
    w.add_tensor("empty_0x4", np.zeros((0, 4), dtype=np.float32))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def summarise(path: Path) -> dict:
    reader = GGUFReader(path)
    kv = []
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        if len(field.types) > 2:
            # Nested array: gguf-py flattens the leaves; record the outer length, the
            # type chain and the flattened leaf values.
            kv.append({
                "key": name,
                "offset": int(field.offset),
                "type": "arr",
                "nested": True,
                # parts: key length, key, value type, element type, outer length, ...
                "len": int(field.parts[4][0]),
                "types": [int(t) for t in field.types],
                "leaves": [int(field.parts[i][0]) for i in field.data],
            })
            continue
        kv.append(summarise_field(field))
    return {
        "file": path.name,
        "size": path.stat().st_size,
        "fnv1a64": "%016x" % fnv1a(path.read_bytes()),
        "version": int(reader.fields["GGUF.version"].contents()),
        "alignment": int(reader.alignment),
        "data_offset": int(reader.data_offset),
        "tensors": [
            {
                "name": t.name,
                "type": int(t.tensor_type),
                "dims": [int(d) for d in t.shape],
                "n_elements": int(t.n_elements),
                "data_offset": int(t.data_offset),
                "n_bytes": int(t.n_bytes),
                "data_fnv1a64": "%016x" % fnv1a(t.data.tobytes()),
            }
            for t in reader.tensors
        ],
        "kv": kv,
    }


def main() -> None:
    out = Path(sys.argv[1])
    path = out / "gguf_py_sample.gguf"
    write_sample(path)
    summary = summarise(path)
    summary["generator"] = "crates/rafter-gguf/tests/gen_gguf_py_sample.py"
    (out / "gguf_py_sample.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
