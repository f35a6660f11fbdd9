"""Time to first token and decode tokens/s through `rafter serve` beside `rafter generate`'s.

On demand, not in CI. For each model, starts `rafter serve` once (loading is not timed), then
alternates, RUNS times: `rafter generate --json-out` (its own prefill and decode timings), and
one streamed /v1/completions request (greedy, `ignore_eos`, the same prompt and token count)
timed by this client: TTFT from sending the request to the first text chunk, decode tokens/s
over the chunks after it. Prints per-run numbers and medians.

    python3 benchmarks/serve_bench.py --rafter target/release/rafter MODEL.gguf [...] \
        [--tokens 128] [--runs 5] [--threads 0]

Standard library only (no openai needed).
"""

import argparse
import http.client
import json
import statistics
import subprocess
import tempfile
import time

PROMPT = ("The history of the printing press begins in the fifteenth century, when a goldsmith "
          "in Mainz combined movable metal type, oil-based ink and a screw press. Over the "
          "following decades the technique spread across Europe and")


def generate(rafter, model, tokens, threads):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([rafter, "generate", model, "-p", PROMPT, "-n", str(tokens),
                        "--threads", str(threads), "--json-out", out.name],
                       check=True, capture_output=True)
        g = json.load(open(out.name))
    t = g["timings"]
    # generate stops at an end-of-sequence token; the decode rate is per generated token.
    return {"ttft_ms": t["prompt_seconds"] * 1e3,
            "tok_s": t["generated_tokens"] / t["generation_seconds"],
            "tokens": t["generated_tokens"], "prompt_tokens": t["prompt_tokens"]}


def serve_once(port, name, tokens):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"model": name, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True,
                       "stream_options": {"include_usage": True}})
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    stamps, usage = [], None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            usage = chunk["usage"]
        if chunk["choices"] and chunk["choices"][0]["text"]:
            stamps.append(time.perf_counter())
    conn.close()
    n = usage["completion_tokens"]
    # Chunks carry text pieces (a piece may hold more than one token, or wait for the next);
    # the rate counts tokens after the first over the time after the first chunk.
    return {"ttft_ms": (stamps[0] - start) * 1e3,
            "tok_s": (n - 1) / (stamps[-1] - stamps[0]),
            "tokens": n, "prompt_tokens": usage["prompt_tokens"]}


def start_server(rafter, model, threads, log):
    p = subprocess.Popen([rafter, "serve", model, "--port", "0", "--model-name", "bench",
                          "--threads", str(threads)],
                         stdout=subprocess.PIPE, stderr=log, text=True)
    line = p.stdout.readline()
    url = next(w for w in line.split() if w.startswith("http://"))
    return p, int(url.split(":")[2].split("/")[0])


def server_timing(log):
    """The server's own timings of its last request (its log line: `prefill P ms, R tok/s`),
    measured as `rafter generate` measures its own."""
    with open(log.name, encoding="utf-8") as f:
        line = [l for l in f if "completion tokens" in l][-1]
    prefill = float(line.split("prefill ")[1].split(" ms")[0])
    rate = float(line.split(" ms, ")[1].split(" tok/s")[0])
    return prefill, rate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rafter", default="target/release/rafter")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    for model in a.models:
        log = tempfile.NamedTemporaryFile(suffix=".log")
        server, port = start_server(a.rafter, model, a.threads, log)
        try:
            serve_once(port, "bench", 4)  # warm-up
            rows = {"generate": [], "serve": []}
            for i in range(a.runs):
                g = generate(a.rafter, model, a.tokens, a.threads)
                s = serve_once(port, "bench", a.tokens)
                s["server_prefill_ms"], s["server_tok_s"] = server_timing(log)
                rows["generate"].append(g)
                rows["serve"].append(s)
                print(f"{model} run {i}: generate ttft {g['ttft_ms']:.0f} ms {g['tok_s']:.1f} tok/s "
                      f"({g['tokens']} tok) | serve ttft {s['ttft_ms']:.0f} ms {s['tok_s']:.1f} tok/s "
                      f"({s['tokens']} tok; server's own: prefill {s['server_prefill_ms']:.0f} ms, "
                      f"{s['server_tok_s']:.1f} tok/s)", flush=True)
            med = {k: (statistics.median(r["ttft_ms"] for r in v),
                       statistics.median(r["tok_s"] for r in v)) for k, v in rows.items()}
            own = (statistics.median(r["server_prefill_ms"] for r in rows["serve"]),
                   statistics.median(r["server_tok_s"] for r in rows["serve"]))
            print(f"{model} median over {a.runs}: generate ttft {med['generate'][0]:.0f} ms, "
                  f"{med['generate'][1]:.1f} tok/s; serve ttft {med['serve'][0]:.0f} ms, "
                  f"{med['serve'][1]:.1f} tok/s; serve/generate decode "
                  f"{med['serve'][1] / med['generate'][1]:.3f}; server's own prefill {own[0]:.0f} ms, "
                  f"{own[1]:.1f} tok/s", flush=True)
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
