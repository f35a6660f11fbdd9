#!/bin/bash
# Alternates the f16 and f32 KV cache (`--kv-type`) of one rafter build on the
# Qwen3-0.6B-shaped GGUFs and prints each run's `generate:` line (2 threads, N generated,
# --ignore-eos) at a 128-token and a 1024-token prompt, swapping which cache goes first
# every round, for same-run decode tok/s and peak RSS. Take medians per (type, prompt, cache).
#
#   RAFTER=target/release/rafter ROUNDS=3 TYPES="f16 q4_k_m" benchmarks/kv_type_ab.sh
#
# MODELS defaults to the llm-fixtures helper's bench folder (scripts/gen_llm_fixtures.py
# --bench); TYPES to every type there; PROMPTS to "128 1024"; N to 128.
set -euo pipefail
RAFTER=${RAFTER:-target/release/rafter}
MODELS=${MODELS:-/work/wt/llm-fixtures/.cache/llm-bench/qwen3-0.6b-shape/gguf}
ROUNDS=${ROUNDS:-3}
TYPES=${TYPES:-"f16 q8_0 q4_0 q4_k_m"}
PROMPTS=${PROMPTS:-"128 1024"}
N=${N:-128}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
for p in $PROMPTS; do
  seq 1001 $((1000 + p)) >"$DIR/p$p.txt"
done
for r in $(seq "$ROUNDS"); do
  order="f16 f32"
  [ $((r % 2)) -eq 0 ] && order="f32 f16"
  for t in $TYPES; do
    for p in $PROMPTS; do
      for kv in $order; do
        line=$("$RAFTER" generate "$MODELS/qwen3-0.6b-shape-$t.gguf" --prompt-ids "$DIR/p$p.txt" \
          -n "$N" --threads 2 --ignore-eos --kv-type "$kv" 2>&1 | grep '^generate:')
        echo "round $r $t prompt $p kv $kv load $(cut -d' ' -f1 /proc/loadavg): $line"
      done
    done
  done
done
