#!/bin/bash
# Alternates two rafter builds on the Qwen3-0.6B-shaped GGUFs and prints each run's
# `generate:` line (prompt 128 tokens, 8 generated, 2 threads), swapping which build goes
# first every round, for a same-run before/after of prefill tok/s. Take medians per type.
#
#   BASE=/tmp/rafter-main NEW=target/release/rafter ROUNDS=5 benchmarks/prefill_ab.sh
#
# MODELS defaults to the llm-fixtures helper's bench folder (scripts/gen_llm_fixtures.py
# --bench); TYPES to every type there.
set -euo pipefail
MODELS=${MODELS:-/work/wt/llm-fixtures/.cache/llm-bench/qwen3-0.6b-shape/gguf}
ROUNDS=${ROUNDS:-5}
TYPES=${TYPES:-"f16 q8_0 q4_0 q4_k_m"}
PROMPT=$(mktemp)
trap 'rm -f "$PROMPT"' EXIT
seq 1001 1128 >"$PROMPT"
for r in $(seq "$ROUNDS"); do
  order="BASE NEW"
  [ $((r % 2)) -eq 0 ] && order="NEW BASE"
  for t in $TYPES; do
    for which in $order; do
      line=$("${!which}" generate "$MODELS/qwen3-0.6b-shape-$t.gguf" --prompt-ids "$PROMPT" \
        -n 8 --threads 2 --ignore-eos 2>&1 | grep '^generate:')
      echo "round $r $t $which load $(cut -d' ' -f1 /proc/loadavg): $line"
    done
  done
done
