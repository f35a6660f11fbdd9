#!/usr/bin/env bash
# Issue 28, item 4 (a start): the Vulkan HAL's stress and big-buffer tests under the Khronos
# validation layer with synchronization validation (Debian: apt install
# vulkan-validationlayers). Prints each message ID with its count; fails on any but the
# layer's own known false positive below.
#
# UNASSIGNED-VkSemaphore-state-timeout ("Timeout waiting for timeline semaphore state to
# update. This is most likely a validation bug"): Debian's layer 1.3.239 reports it on the
# monitor's wake semaphore, whose vkWaitSemaphores(ANY) returns on another semaphore, and
# then blocks for seconds inside the layer; tests/device.rs ran past 300 s under it. Hence
# this subset, and no CI job yet.
#
# Usage: scripts/vulkan_validation.sh   (RAFTER_STRESS_SECS, default 5)
set -euo pipefail
KNOWN='UNASSIGNED-VkSemaphore-state-timeout'
export VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation
export VK_LAYER_ENABLES=VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT
export RAFTER_STRESS_SECS=${RAFTER_STRESS_SECS:-5} RAFTER_REQUIRE_VULKAN=1
log=$(mktemp /tmp/vulkan_validation.XXXXXX)
cargo test --release -p rafter-hal-vulkan --test stress --test big_buffer -- --nocapture >"$log" 2>&1 || {
    tail -30 "$log"; echo "tests failed under validation (log: $log)"; exit 1; }
ids=$(grep -o '\[ [A-Za-z0-9_-]* \]' "$log" | sort | uniq -c || true)
echo "validation messages (count, id):"; echo "${ids:-  none}"
if echo "$ids" | grep -v "$KNOWN" | grep -q '\['; then
    echo "validation errors other than the layer's known false positive (log: $log)"; exit 1
fi
echo "no validation error but the known false positive (log: $log)"
