#!/usr/bin/env bash
# H200: link latency = mean of the directions' handoff medians, barrier 0 (A) vs barrier
# 27 us (B: the earlier empty/2), split margin 5%; auto vs vulkan on BERT, MiniLM,
# MobileNetV2, ResNet-50, midgraph, alternated, two rounds.
set -u
bash .gl/setup.sh > /dev/null 2>&1
R=.devbench/rafter; xz -dkf .devbench/rafter.xz; chmod +x $R
M=.cache/models; mkdir -p $M
python3 benchmarks/gpu/export_midgraph.py $M > /tmp/exp.txt 2>&1 || tail -3 /tmp/exp.txt
python3 scripts/export_models.py --only mobilenet_v2 resnet50 minilm_l6 bert_base > /tmp/export.txt 2>&1; tail -1 /tmp/export.txt
RAFTER_DEVICE_PROFILES=$OUT/A.txt $R devices --profile > $OUT/profileA.log 2>&1
grep -E "calibrate vulkan: (hand|calls)|link" $OUT/profileA.log
sed -E 's/^(device vulkan dispatch_s=[^ ]+) barrier_s=[^ ]+/\1 barrier_s=2.7e-5/' $OUT/A.txt > $OUT/B.txt
grep "device vulkan" $OUT/A.txt $OUT/B.txt
ins() { local m=$1 s=""; for f in $M/${m}_inputs/*.npy; do [ -f "$f" ] && s="$s --input $(basename $f .npy)=$f"; done; echo "$s"; }
for m in midgraph bert_base minilm_l6 mobilenet_v2 resnet50; do
  for p in A B; do RAFTER_DEVICE_PROFILES=$OUT/$p.txt $R plan $M/$m.onnx --target auto > $OUT/plan_${m}_$p.txt 2>&1
    echo "$m plan $p: $(grep -E '^placement:' $OUT/plan_${m}_$p.txt | cut -c1-60) | $(grep -E '^cost model' $OUT/plan_${m}_$p.txt | cut -c1-110) | $(grep 'without the cost' $OUT/plan_${m}_$p.txt | sed 's/.*accelerator)://' | cut -c1-40)"; done
  I=$(ins $m)
  timeout 100 $R bench $M/$m.onnx --device vulkan $I --warmup 2 --iters 3 > /dev/null 2>&1
  for r in 1 2; do
    echo "$m vulkan r$r: $(timeout 100 $R bench $M/$m.onnx --device vulkan $I --warmup 5 --iters 40 2>&1 | grep '^bench:' | cut -c1-60)"
    for p in A B; do
      echo "$m auto$p r$r: $(RAFTER_DEVICE_PROFILES=$OUT/$p.txt timeout 100 $R bench $M/$m.onnx --device auto $I --warmup 5 --iters 40 --estimate 2>&1 | grep -E '^bench:|^estimate:|^compiled' | tr '\n' ' ' | cut -c1-260)"
    done
  done
done
cd $OUT && tar czf plans.tgz plan_* && rm plan_*
echo "done in ${SECONDS}s"
