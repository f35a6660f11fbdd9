"""Drives `rafter serve` with the official `openai` client, as a real application would.

Run by crates/rafter-cli/tests/serve.rs, which starts `rafter serve` on the tiny Qwen3 fixture
(random weights: the text is gibberish, so this checks the protocol, not prose) and passes
the greedy references it made with `rafter generate --json-out`:

    python openai_client.py BASE_URL MODEL REFS.json CONTEXT

REFS.json holds `chat`, `plain` and `sampled`: `rafter generate` outputs (prompt_ids,
generated_ids, text, finish_reason) with the request each came from. Every check raises on
failure; the script prints one line per passed check and exits non-zero on the first failure.
"""

import json
import sys
import threading
import time
import urllib.error
import urllib.request

import openai

BASE_URL, MODEL, REFS, CONTEXT = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ROOT = BASE_URL.rsplit("/v1", 1)[0]
with open(REFS, encoding="utf-8") as f:
    REF = json.load(f)

client = openai.OpenAI(base_url=BASE_URL, api_key="unused", max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def ok(name):
    print(f"ok: {name}", flush=True)


def health():
    with urllib.request.urlopen(f"{ROOT}/health", timeout=30) as r:
        check(r.status == 200, f"/health answered {r.status}")
        return json.load(r)


def wait_idle(timeout=60.0):
    """Waits until no request runs or waits; returns the last /health."""
    end = time.monotonic() + timeout
    while True:
        h = health()
        if h["queue"]["running"] == 0 and h["queue"]["queued"] == 0:
            return h
        check(time.monotonic() < end, f"the server is still busy after {timeout} s: {h}")
        time.sleep(0.05)


def extra(obj, field):
    """A field outside OpenAI's schema (rafter's `token_ids` extension)."""
    return (obj.model_extra or {}).get(field)


def chat_messages():
    return [{"role": "user", "content": REF["chat"]["request"]["prompt"]}]


def chat(**kw):
    args = {"model": MODEL, "messages": chat_messages(), "temperature": 0,
            "max_tokens": REF["chat"]["request"]["max_tokens"]}
    return client.chat.completions.create(**{**args, **kw})


def completion(**kw):
    args = {"model": MODEL, "prompt": REF["plain"]["request"]["prompt"], "temperature": 0,
            "max_tokens": REF["plain"]["request"]["max_tokens"]}
    return client.completions.create(**{**args, **kw})


def check_chat(r, what):
    ref = REF["chat"]
    c = r.choices[0]
    check(c.message.role == "assistant", f"{what}: role {c.message.role}")
    check(
        extra(c, "token_ids") == ref["generated_ids"],
        f"{what}: tokens {extra(c, 'token_ids')} != rafter generate's {ref['generated_ids']}",
    )
    check(c.message.content == ref["text"], f"{what}: text {c.message.content!r} != {ref['text']!r}")
    check(c.finish_reason == ref["finish_reason"], f"{what}: finish_reason {c.finish_reason}")
    u = r.usage
    check(
        (u.prompt_tokens, u.completion_tokens, u.total_tokens)
        == (len(ref["prompt_ids"]), len(ref["generated_ids"]),
            len(ref["prompt_ids"]) + len(ref["generated_ids"])),
        f"{what}: usage {u}",
    )


def check_completion(r, what):
    ref = REF["plain"]
    c = r.choices[0]
    check(extra(c, "token_ids") == ref["generated_ids"], f"{what}: tokens {extra(c, 'token_ids')}")
    check(c.text == ref["text"], f"{what}: text {c.text!r} != {ref['text']!r}")
    check(c.finish_reason == ref["finish_reason"], f"{what}: finish_reason {c.finish_reason}")
    check(r.usage.prompt_tokens == len(ref["prompt_ids"]), f"{what}: usage {r.usage}")
    check(r.usage.completion_tokens == len(ref["generated_ids"]), f"{what}: usage {r.usage}")


def test_models():
    ids = [m.id for m in client.models.list().data]
    check(ids == [MODEL], f"/v1/models lists {ids}")
    check(client.models.retrieve(MODEL).id == MODEL, "retrieve")
    h = health()
    check(h["status"] == "ok" and h["context_length"] == CONTEXT, f"/health {h}")
    ok("models and health")


def test_chat_greedy():
    check_chat(chat(extra_body={"return_token_ids": True}), "chat")
    # max_completion_tokens is the current name of max_tokens.
    ref = REF["chat"]
    r = client.chat.completions.create(
        model=MODEL, messages=chat_messages(), temperature=0,
        max_completion_tokens=ref["request"]["max_tokens"],
    )
    check(r.choices[0].message.content == ref["text"], "max_completion_tokens")
    ok("chat greedy = rafter generate --chat")


def test_chat_stream():
    ref = REF["chat"]
    stream = chat(stream=True, stream_options={"include_usage": True})
    pieces, reasons, usage, roles = [], [], None, []
    for chunk in stream:
        check(chunk.object == "chat.completion.chunk", f"chunk object {chunk.object}")
        if chunk.usage is not None:
            check(chunk.choices == [], "the usage chunk has no choices")
            usage = chunk.usage
            continue
        d = chunk.choices[0].delta
        if d.role:
            roles.append(d.role)
        if d.content:
            pieces.append(d.content)
        if chunk.choices[0].finish_reason:
            reasons.append(chunk.choices[0].finish_reason)
    check(roles == ["assistant"], f"roles {roles}")
    check("".join(pieces) == ref["text"], f"streamed {''.join(pieces)!r} != {ref['text']!r}")
    check(len(pieces) > 1, "the text came in pieces")
    check(reasons == [ref["finish_reason"]], f"finish reasons {reasons}")
    check(usage is not None and usage.completion_tokens == len(ref["generated_ids"]), f"usage {usage}")
    check(usage.prompt_tokens == len(ref["prompt_ids"]), f"usage {usage}")
    ok("chat stream (with include_usage) = rafter generate --chat")


def test_completion_greedy_and_stream():
    check_completion(completion(extra_body={"return_token_ids": True}), "completion")
    ref = REF["plain"]
    pieces, reasons = [], []
    for chunk in completion(stream=True):
        check(chunk.usage is None, "no usage without include_usage")
        pieces.append(chunk.choices[0].text)
        if chunk.choices[0].finish_reason:
            reasons.append(chunk.choices[0].finish_reason)
    check("".join(pieces) == ref["text"], f"streamed {''.join(pieces)!r}")
    check(reasons == [ref["finish_reason"]], f"finish reasons {reasons}")
    # echo writes the prompt first.
    r = completion(echo=True)
    check(r.choices[0].text == ref["request"]["prompt"] + ref["text"], "echo")
    ok("completion greedy, streamed and echoed = rafter generate")


def test_seeded_sampling():
    ref = REF["sampled"]
    q = ref["request"]
    r = client.completions.create(
        model=MODEL, prompt=q["prompt"], max_tokens=q["max_tokens"],
        temperature=q["temperature"], seed=q["seed"], extra_body={"top_k": q["top_k"]},
    )
    check(r.choices[0].text == ref["text"], f"seeded {r.choices[0].text!r} != {ref['text']!r}")
    ok("seeded sampling (temperature, top_k) = rafter generate's")


def test_stop():
    ref = REF["plain"]
    text = ref["text"]
    # A stop string from the middle of the greedy text: the completion ends before it.
    cut = len(text) // 2
    stop = text[cut:cut + 3]
    first = text.find(stop)
    r = completion(stop=[stop, "\x00never"])
    check(r.choices[0].text == text[:first], f"stop {stop!r}: {r.choices[0].text!r} != {text[:first]!r}")
    check(r.choices[0].finish_reason == "stop", f"stop: finish_reason {r.choices[0].finish_reason}")
    ok(f"stop string {stop!r}")


def test_concurrent():
    results, errors = {}, []

    def run(name, fn):
        try:
            results[name] = fn()
        except Exception as e:  # reported below
            errors.append(f"{name}: {e!r}")

    threads = [
        threading.Thread(target=run, args=("chat", lambda: chat(extra_body={"return_token_ids": True}))),
        threading.Thread(target=run, args=("completion", lambda: completion(extra_body={"return_token_ids": True}))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, f"concurrent requests failed: {errors}")
    check_chat(results["chat"], "concurrent chat")
    check_completion(results["completion"], "concurrent completion")
    ok("two concurrent clients (one runs, one waits: --max-queue 1) each get rafter generate's tokens")


def long_stream(max_tokens):
    """A completion stream that runs until max_tokens (ignore_eos)."""
    return client.completions.create(
        model=MODEL, prompt="Count:", max_tokens=max_tokens, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )


def test_disconnect():
    before = wait_idle()["queue"]
    max_tokens = CONTEXT - 16
    stream = long_stream(max_tokens)
    got = 0
    for _ in stream:
        got += 1
        if got == 3:
            break
    stream.close()  # the client goes away mid-stream
    h = wait_idle()["queue"]
    check(h["cancelled"] == before["cancelled"] + 1, f"cancelled count {before} -> {h}")
    wasted = h["cancelled_tokens"] - before["cancelled_tokens"]
    check(wasted < max_tokens // 2, f"the cancelled generation ran {wasted} of {max_tokens} tokens")
    # The next request is served, and right.
    check_chat(chat(extra_body={"return_token_ids": True}), "chat after a disconnect")
    ok(f"a client that disconnects mid-stream is cancelled ({wasted} tokens computed) and the next request is right")


def test_disconnect_non_streaming():
    before = wait_idle()["queue"]
    max_tokens = CONTEXT - 16
    try:
        client.with_options(timeout=0.5).completions.create(
            model=MODEL, prompt="Count:", max_tokens=max_tokens, temperature=0,
            extra_body={"ignore_eos": True})
        raise AssertionError("a long generation finished within the client's 0.5 s timeout")
    except openai.APITimeoutError:
        pass  # the client gave up and closed its connection
    h = wait_idle()["queue"]
    check(h["cancelled"] == before["cancelled"] + 1, f"cancelled count {before} -> {h}")
    wasted = h["cancelled_tokens"] - before["cancelled_tokens"]
    check(wasted < max_tokens // 2, f"the cancelled generation ran {wasted} of {max_tokens} tokens")
    check_completion(completion(extra_body={"return_token_ids": True}), "completion after a timeout")
    ok(f"a non-streaming client that gives up is cancelled too ({wasted} tokens computed)")


def test_queue_full(max_queue):
    check(max_queue == 1, "run the server with --max-queue 1")
    wait_idle()
    running = long_stream(CONTEXT - 16)
    next(iter(running))  # its first token: it holds the model
    waiting = long_stream(8)  # admitted: its headers came back
    check(health()["queue"]["queued"] == 1, f"one waits: {health()}")
    try:
        completion()
        raise AssertionError("a request past --max-queue was accepted")
    except openai.APIStatusError as e:
        check(e.status_code == 503, f"queue full: status {e.status_code}")
        check(e.code == "queue_full", f"queue full: code {e.code}")
    running.close()
    waiting.close()
    wait_idle()
    check_completion(completion(extra_body={"return_token_ids": True}), "completion after a full queue")
    ok("a request past --max-queue gets 503 queue_full; the others are cancelled cleanly")


def expect_error(fn, status, param=None, code=None, contains=None):
    try:
        fn()
    except openai.APIStatusError as e:
        check(e.status_code == status, f"status {e.status_code} != {status}: {e}")
        body = e.body or {}
        if param is not None:
            check(e.param == param, f"param {e.param!r} != {param!r}: {body}")
        if code is not None:
            check(e.code == code, f"code {e.code!r} != {code!r}: {body}")
        if contains is not None:
            check(contains in e.message, f"{contains!r} not in {e.message!r}")
        return
    raise AssertionError(f"expected an error {status}")


def raw_post(path, body, content_type="application/json"):
    req = urllib.request.Request(f"{ROOT}{path}", data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_errors():
    expect_error(lambda: client.chat.completions.create(model="nope", messages=chat_messages()),
                 404, param="model", code="model_not_found")
    long_prompt = "hello " * (CONTEXT + 10)
    expect_error(lambda: client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=4),
                 400, param="prompt", code="context_length_exceeded", contains=str(CONTEXT))
    expect_error(lambda: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": long_prompt}]),
        400, param="messages", code="context_length_exceeded", contains=str(CONTEXT))
    expect_error(lambda: completion(max_tokens=CONTEXT), 400, code="context_length_exceeded")
    expect_error(lambda: chat(temperature=5), 400, param="temperature")
    expect_error(lambda: chat(top_p=0), 400, param="top_p")
    expect_error(lambda: chat(presence_penalty=0.5), 400, param="presence_penalty")
    expect_error(lambda: chat(n=2), 400, param="n")
    expect_error(lambda: chat(stop=["a", 3]), 400, param="stop[1]")
    expect_error(lambda: client.chat.completions.create(model=MODEL, messages=[]), 400, param="messages")
    expect_error(lambda: client.chat.completions.create(
        model=MODEL, messages=[{"role": "wizard", "content": "x"}]), 400, param="messages[0].role")
    expect_error(lambda: chat(extra_body={"frobnicate": 1}), 400, param="frobnicate")
    expect_error(lambda: chat(max_tokens="many"), 400, param="max_tokens")
    status, body = raw_post("/v1/chat/completions", b'{"model": ')
    check(status == 400 and body["error"]["code"] == "invalid_json", f"malformed JSON: {status} {body}")
    check(body["error"]["type"] == "invalid_request_error", f"malformed JSON: {body}")
    status, body = raw_post("/v1/chat/completions", b"[1, 2]")
    check(status == 400 and "object" in body["error"]["message"], f"a JSON array: {status} {body}")
    status, body = raw_post("/v1/nowhere", b"{}")
    check(status == 404 and "error" in body, f"unknown URL: {status} {body}")
    # Errors leave the server healthy.
    check_chat(chat(extra_body={"return_token_ids": True}), "chat after errors")
    ok("errors: OpenAI error objects with 4xx codes, param and code")


def main():
    max_queue = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    test_models()
    test_chat_greedy()
    test_chat_stream()
    test_completion_greedy_and_stream()
    test_seeded_sampling()
    test_stop()
    test_errors()
    test_concurrent()
    test_disconnect()
    test_disconnect_non_streaming()
    test_queue_full(max_queue)
    h = wait_idle()["queue"]
    check(h["failed"] == 0, f"no generation failed: {h}")
    print(f"all passed; /health queue: {json.dumps(h)}", flush=True)


if __name__ == "__main__":
    main()
