#!/usr/bin/env bash
# H200: the monitor's polling (RAFTER_VULKAN_MONITOR_POLL_US) and host signals that release
# deferred GPU work before vkSignalSemaphore: handoffs (midgraph auto, BERT vulkan), pure-GPU
# latency and process CPU time (MobileNetV2 vulkan), against the previous binary; then the
# HAL stress and `conformance --threads 8` runs with polling on.
set -u
out=${OUT:-/tmp/out}; mkdir -p $out
bash .gl/setup.sh > $out/setup.txt 2>&1
for b in rafter-new rafter-poll stress; do xz -dkf .devbench/$b.xz; chmod +x .devbench/$b; done
M=.cache/models; mkdir -p $M
python3 benchmarks/gpu/export_midgraph.py $M > $out/export_mid.txt 2>&1; tail -1 $out/export_mid.txt
python3 scripts/export_models.py --only bert_base,mobilenet_v2 > $out/export.txt 2>&1; tail -1 $out/export.txt
ins() { local m=$1 s=""; for f in $M/${m}_inputs/*.npy; do [ -f "$f" ] && s="$s --input $(basename $f .npy)=$f"; done; echo "$s"; }
export RAFTER_DEVICE_PROFILES=$out/profiles.txt
.devbench/rafter-poll devices --profile > $out/profile.txt 2>&1; grep "^link" $RAFTER_DEVICE_PROFILES
TIMEFORMAT='cpu user %U s sys %S s'
run() { # variant label cmd...
  local v=$1; shift; local R=.devbench/rafter-poll P=10
  case $v in old) R=.devbench/rafter-new;; p0) P=0;; p10) P=10;; p3) P=3;; esac
  { time RAFTER_VULKAN_MONITOR_POLL_US=$P timeout 200 $R "$@" > /tmp/o.txt 2>&1; } 2> /tmp/time.txt
  echo "$(grep -E '^bench|^handoffs' /tmp/o.txt | tr '\n' ' ' | cut -c1-300) | $(cat /tmp/time.txt)"
}
for r in 1 2; do
  for v in old p0 p10 p3; do
    echo "midgraph auto trace $v r$r: $(run $v bench $M/midgraph.onnx --device auto --warmup 5 --iters 100 --trace /tmp/t.json)"
    echo "midgraph auto $v r$r: $(run $v bench $M/midgraph.onnx --device auto --warmup 10 --iters 300)"
    echo "bert vulkan trace $v r$r: $(run $v bench $M/bert_base.onnx --device vulkan $(ins bert_base) --warmup 5 --iters 50 --trace /tmp/t.json)"
    echo "mobilenet vulkan $v r$r: $(run $v bench $M/mobilenet_v2.onnx --device vulkan $(ins mobilenet_v2) --warmup 20 --iters 500)"
  done
done
echo "== stress (polling on), 60 s"
RAFTER_STRESS_SECS=60 timeout 200 .devbench/stress --nocapture > $out/stress.txt 2>&1; echo "rc=$?"; grep -E "seed|test result|chains|panicked" $out/stress.txt | head -8
echo "== conformance --device vulkan --threads 8 (polling on)"
mkdir -p /tmp/conf && tar xJf .devbench/conf.tar.xz -C /tmp/conf
export RAFTER_CONFORMANCE_DIR=/tmp/conf/onnx-conformance
RAFTER=.devbench/rafter-poll COLD_RUNS=1 WARM_RUNS=6 BUDGET_S=150 LOG_DIR=$out/stall bash scripts/stall_check.sh 6 8 90 2>&1 | tail -12
echo "done in ${SECONDS}s"
