#!/usr/bin/env bash
# The H200 machine's host CPU, alone: how steady it is (vmstat's steal and run queue
# around the runs), every CPU kernel of MiniLM-L6 and BERT-base against its estimate
# (`bench --estimate` with RAFTER_ESTIMATE_KERNELS, after a CPU-only `devices --profile`),
# and call latency by thread count (16, 15, 12, 8) alternated over rounds, to see whether
# fewer threads than vCPUs ride out a neighbour's load. ~3 minutes.
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out/h"
R=.gl/rafter
M=.cache/models
( vmstat 1 400 > "$out/h/vmstat.txt" 2>&1 & echo $! > /tmp/vmstat.pid )
top -bn1 | head -25 > "$out/h/top.txt"
python3 scripts/export_models.py --only mobilenet_v2 minilm_l6 bert_base > "$out/h/export.txt" 2>&1
export RAFTER_DEVICE_PROFILES=$out/h/profiles.txt
VK_DRIVER_FILES=/nonexistent.json RAFTER_PROFILE_POINTS=1 $R devices --profile > "$out/h/profile.txt" 2>&1
inputs() { for f in $M/$1_inputs/*.npy; do printf -- '--input %s=%s ' "$(basename "$f" .npy)" "$f"; done; }
for m in minilm_l6 bert_base; do
  RAFTER_ESTIMATE_KERNELS=1000 VK_DRIVER_FILES=/nonexistent.json $R bench $M/$m.onnx $(inputs $m) \
    --device cpu --estimate --iters 20 > "$out/h/est_$m.txt" 2>&1
done
for round in 1 2 3; do
  for m in mobilenet_v2 minilm_l6; do
    for t in 16 15 12 8; do
      echo "$(date +%s) $m t$t r$round" >> "$out/h/order.txt"
      VK_DRIVER_FILES=/nonexistent.json $R bench $M/$m.onnx $(inputs $m) --device cpu \
        --threads $t --warmup 10 --iters 100 > "$out/h/threads_${m}_t${t}_r$round.txt" 2>&1
    done
  done
done
kill "$(cat /tmp/vmstat.pid)" 2>/dev/null
cd "$out" && tar czf h.tgz h && rm -rf h
