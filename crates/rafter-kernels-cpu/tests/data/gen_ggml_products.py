#!/usr/bin/env python3
"""Makes tests/data/ggml_products.txt: what ggml's CPU backend itself computes for the
quantized-weight products, for `tests/quant_ggml.rs`.

    python3 gen_ggml_products.py /path/to/llama.cpp/build/bin [OUT_FILE]

The directory is a llama.cpp build with native flags (`benchmarks/setup_llama_cpp.sh` makes
one in .cache/llama.cpp/build/bin, from the llama-cpp-python 0.3.36 sdist): the script loads
its libggml-base.so and libggml-cpu.so through ctypes. The Python running it needs numpy.
Nothing here is needed by `cargo test`: the output is committed. The one committed was made
on the project's machine (AMD EPYC, Zen 5: AVX-512 F/BW/VL/VNNI/VBMI, so ggml's x86 build
ran its AVX2/AVX-512 code).

What it records:
- `x`: 6 rows of K = 512 f32 (random with a different magnitude per 32 elements; rounding
  ties at scale 1, which tell ggml's x86 quantizers' round-to-nearest-even from the `_ref`
  ones' `roundf`; zero and constant blocks; a wide dynamic range; +-max ties);
- `act TYPE ROW`: ggml's activation quantization of each x row, `from_float` of Q8_0, Q8_1
  and Q8_K from `ggml_get_type_traits_cpu` (what `ggml_compute_forward_mul_mat` runs on
  src1), as block bytes;
- `w FORMAT ROW`: 4 weight rows per format with a ggml dot product (Q4_0, Q4_1, Q5_0,
  Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), quantized by ggml's `quantize_row_*_ref`
  (llama-quantize without an imatrix) from random values;
- `dot FORMAT XROW`: ggml's `vec_dot` of the format (the weight row against the x row
  quantized as its `vec_dot_type`) for each of the 4 weight rows, f32 bits.

It also checks, and fails otherwise, that the interleaved quantizers of ggml's repacked
Q4_0 / Q4_K kernels (`ggml_quantize_mat_q8_0_4x8`, `ggml_quantize_mat_q8_K_4x8`, which
llama.cpp runs instead on AVX2 machines for weights it repacks) give the same `d * q` for
every element as `from_float` does: whichever path llama.cpp takes, the activations are
these.

File format: `#` comments, `k K`, then lines `x ROW HEX_F32...`, `act TYPE ROW HEX_BYTES`,
`w FORMAT ROW HEX_BYTES`, `dot FORMAT XROW HEX_F32...` (f32 as big-endian bit patterns).
"""
import ctypes
import os
import sys

import numpy as np

LIB_DIR = os.path.abspath(sys.argv[1])
OUT = os.path.abspath(
    sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "ggml_products.txt")
)
K = 512
N = 4

# ggml_type ids (ggml.h) and block sizes.
TYPES = {
    "q4_0": (2, 32, 18), "q4_1": (3, 32, 20), "q5_0": (6, 32, 22), "q5_1": (7, 32, 24),
    "q8_0": (8, 32, 34), "q8_1": (9, 32, 36), "q2_K": (10, 256, 84), "q3_K": (11, 256, 110),
    "q4_K": (12, 256, 144), "q5_K": (13, 256, 176), "q6_K": (14, 256, 210), "q8_K": (15, 256, 292),
}
WEIGHTS = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K"]
ACTS = ["q8_0", "q8_1", "q8_K"]


class Traits(ctypes.Structure):
    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
VEC_DOT = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
)

base = ctypes.CDLL(os.path.join(LIB_DIR, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
cpu = ctypes.CDLL(os.path.join(LIB_DIR, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
cpu.ggml_cpu_init()
cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(Traits)


def traits(name):
    return cpu.ggml_get_type_traits_cpu(TYPES[name][0]).contents


def ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def row_bytes(name, k):
    _, be, bb = TYPES[name]
    return k // be * bb


def from_float(name, x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(row_bytes(name, len(x)), dtype=np.uint8)
    FROM_FLOAT(traits(name).from_float)(ptr(x), ptr(out), len(x))
    return out


def quantize_ref(name, x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(row_bytes(name, len(x)), dtype=np.uint8)
    fn = getattr(base, f"quantize_row_{name}_ref")
    fn(ptr(x), ptr(out), ctypes.c_int64(len(x)))
    return out


def vec_dot(name, w, a):
    t = traits(name)
    s = np.zeros(1, dtype=np.float32)
    VEC_DOT(t.vec_dot)(K, ptr(s), 0, ptr(w), 0, ptr(a), 0, 1)
    return s[0]


def act_values(name, a):
    """d * q of every element of one activation row (ggml's block layouts)."""
    _, be, bb = TYPES[name]
    out = []
    for blk in a.reshape(-1, bb):
        if name == "q8_K":
            d = blk[:4].view(np.float32)[0]
            q = blk[4:260].view(np.int8)
        else:
            d = np.float32(blk[:2].view(np.float16)[0])
            q = blk[bb - 32:].view(np.int8)
        out.append(d * q.astype(np.float32))
    return np.concatenate(out)


def check_repack_quantizers(x):
    """The 4-row interleaved quantizers give the same d * q as from_float."""
    rows = np.ascontiguousarray(x[:4], dtype=np.float32)
    for name, fn, be, dsize in [
        ("q8_0", "ggml_quantize_mat_q8_0_4x8", 32, 2),
        ("q8_K", "ggml_quantize_mat_q8_K_4x8", 256, 4),
    ]:
        bb = 4 * dsize + 4 * be + (be // 4 * 2 if name == "q8_K" else 0)
        out = np.zeros(K // be * bb, dtype=np.uint8)
        getattr(cpu, fn)(ptr(rows), ptr(out), ctypes.c_int64(K))
        for b, blk in enumerate(out.reshape(-1, bb)):
            d = blk[: 4 * dsize].view(np.float16 if dsize == 2 else np.float32).astype(np.float32)
            qs = blk[4 * dsize: 4 * dsize + 4 * be].view(np.int8)
            for r in range(4):
                want = act_values(name, from_float(name, rows[r]))[b * be:(b + 1) * be]
                # Element e of row r sits at (e / 8) * 32 + 8 r + e % 8.
                idx = [(e // 8) * 32 + 8 * r + e % 8 for e in range(be)]
                got = d[r] * qs[idx].astype(np.float32)
                if not np.array_equal(got, want):
                    sys.exit(f"{fn}: row {r} block {b} differs from from_float")


def make_x(rng):
    x = np.zeros((6, K), dtype=np.float32)
    # 0: random, a different magnitude per 32 elements.
    mags = np.array([1.0, 4.0, 0.25, 30.0, 0.01, 1.5, 0.7, 9.0])
    x[0] = rng.standard_normal(K) * np.repeat(np.resize(mags, K // 32), 32)
    # 1: ties: blocks whose max is 127 (scale 1), elements at half-integers.
    for b in range(K // 32):
        v = rng.integers(-126, 126, 32) + 0.5
        v[rng.integers(0, 32)] = 127.0 if b % 2 else -127.0
        x[1, 32 * b:32 * (b + 1)] = v
    # 2: zero blocks, constant blocks, random.
    x[2] = rng.standard_normal(K)
    x[2, 0:32] = 0.0
    x[2, 64:96] = 0.3
    x[2, 256:288] = 0.0
    x[2, 320:352] = -2.0
    # 3: a wide dynamic range.
    x[3] = rng.standard_normal(K) * 10.0 ** rng.uniform(-3, 3, K)
    # 4: all positive.
    x[4] = rng.uniform(0.001, 1.0, K)
    # 5: +max and -max in every block (Q8_K's signed max), the rest random.
    x[5] = rng.standard_normal(K)
    for b in range(K // 32):
        x[5, 32 * b + 3] = 5.0
        x[5, 32 * b + 17] = -5.0
    return x.astype(np.float32)


def hexf(v):
    return " ".join(f"{int(b):08x}" for b in np.asarray(v, dtype=np.float32).view(np.uint32))


def main():
    rng = np.random.default_rng(20250125)
    x = make_x(rng)
    check_repack_quantizers(x)
    lines = [
        "# ggml's own activation quantization and quantized dot products (x86-64 build,",
        "# native flags), made by gen_ggml_products.py; see its docstring. Do not edit.",
        f"k {K}",
    ]
    for r in range(len(x)):
        lines.append(f"x {r} {hexf(x[r])}")
    for name in ACTS:
        for r in range(len(x)):
            lines.append(f"act {name} {r} {from_float(name, x[r]).tobytes().hex()}")
    types = []
    for name in WEIGHTS:
        t = traits(name)
        act = [k for k, v in TYPES.items() if v[0] == t.vec_dot_type][0]
        types.append(f"# {name}: vec_dot_type {act}")
        w = []
        for n in range(N):
            scale = [1.0, 0.02, 7.0, 0.3][n]
            w.append(quantize_ref(name, rng.standard_normal(K).astype(np.float32) * scale))
            lines.append(f"w {name} {n} {w[n].tobytes().hex()}")
        for r in range(len(x)):
            a = from_float(act, x[r])
            lines.append(f"dot {name} {r} {hexf([vec_dot(name, w[n], a) for n in range(N)])}")
    lines[2:2] = types
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


main()
