#!/usr/bin/env bash
# H200: issue 26's full table at the session's final binary (latency untraced,
# estimates, untraced streams, spread leaving a core to the GPU's host threads).
set -u
bash .gl/setup.sh > /dev/null 2>&1
xz -dkf .devbench/rafter.xz; chmod +x .devbench/rafter
mkdir -p /tmp/out
STREAMS=1 REPS=3 ITERS=60 BUDGET_S=420 OUT=/tmp/out bash benchmarks/gpu/h200_partition.sh > /tmp/out/log.txt 2>&1
grep -E "calibrate vulkan: hand|link|dispatch" /tmp/out/profile.txt
cat /tmp/out/summary.md
grep SKIPPED /tmp/out/log.txt
tar czf $OUT/results.tgz -C /tmp out
echo "done in ${SECONDS}s"
