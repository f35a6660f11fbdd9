#!/usr/bin/env bash
# Tallies why ONNX conformance models keep kernels off the GPU: runs
# `rafter plan --target vulkan` on every test model and counts, over the models that place
# no kernel on vulkan, each grouped reason `rafter plan` gives (node names taken out), most
# frequent first. Usage: scripts/vulkan_placement_tally.sh [SUITE_DIR] [RAFTER]
# (defaults: $RAFTER_CONFORMANCE_DIR, target/release/rafter).
set -euo pipefail
dir=${1:-${RAFTER_CONFORMANCE_DIR:-.cache/onnx-conformance}}
rafter=${2:-target/release/rafter}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
total=0 cpu_only=0
while IFS= read -r model; do
    total=$((total + 1))
    name=$(basename "$(dirname "$model")")
    if ! out=$("$rafter" plan --target vulkan "$model" 2>&1); then
        echo "$name: $(echo "$out" | tail -1)" >>"$tmp/errors"
        continue
    fi
    if echo "$out" | grep -q '^placement: 0 of'; then
        cpu_only=$((cpu_only + 1))
        # The grouped reasons: "    N kernels, P% of the work: REASON".
        echo "$out" | sed -n 's/^    [0-9]* kernels\?, [0-9.]*% of the work: //p' |
            sort -u | sed "s|\$|\t$name|" >>"$tmp/reasons"
    fi
done < <(find "$dir" -name model.onnx | sort)
echo "models: $total, with no kernel on vulkan: $cpu_only, failing to plan: $(wc -l <"$tmp/errors" 2>/dev/null || echo 0)"
echo "reasons over the cpu-only models (models per reason):"
cut -f1 "$tmp/reasons" | sort | uniq -c | sort -rn
