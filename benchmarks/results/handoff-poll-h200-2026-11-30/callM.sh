#!/usr/bin/env bash
# H200 (short budget): handoffs on midgraph split by support (--device vulkan: its LRNs on
# the CPU), pure-GPU MobileNetV2 latency and process CPU time; old binary vs polling 0/10 us.
set -u
bash .gl/setup.sh > /dev/null 2>&1
for b in rafter-new rafter-poll; do [ -x .devbench/$b ] || { xz -dkf .devbench/$b.xz; chmod +x .devbench/$b; }; done
M=.cache/models; mkdir -p $M
[ -f $M/midgraph.onnx ] || python3 benchmarks/gpu/export_midgraph.py $M > /dev/null 2>&1
python3 scripts/export_models.py --only mobilenet_v2 > /tmp/export.txt 2>&1; tail -1 /tmp/export.txt
ins() { local m=$1 s=""; for f in $M/${m}_inputs/*.npy; do [ -f "$f" ] && s="$s --input $(basename $f .npy)=$f"; done; echo "$s"; }
TIMEFORMAT='cpu %U+%S s'
run() {
  local v=$1; shift; local R=.devbench/rafter-poll P=10
  case $v in old) R=.devbench/rafter-new;; p0) P=0;; esac
  { time RAFTER_VULKAN_MONITOR_POLL_US=$P timeout 100 $R "$@" > /tmp/o.txt 2>&1; } 2> /tmp/time.txt
  echo "$(grep -E 'bench:|handoffs' /tmp/o.txt | tr '\n' ' ' | sed 's/peak RSS [0-9.]* MB//' | cut -c1-330) | $(cat /tmp/time.txt)"
}
for r in 1 2; do
  for v in old p0 p10; do
    echo "mid $v r$r: $(run $v bench $M/midgraph.onnx --device vulkan --warmup 5 --iters 100 --trace /tmp/t.json)"
    echo "mnv2 $v r$r: $(run $v bench $M/mobilenet_v2.onnx --device vulkan $(ins mobilenet_v2) --warmup 20 --iters 500)"
  done
done
echo "done in ${SECONDS}s"
