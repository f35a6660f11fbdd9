#!/usr/bin/env python3
"""Why ONNX node tests stay off the GPU: for every test of the suite the CPU path passes,
run `rafter plan --target vulkan` on its model and count the tests with no kernel on the
GPU by the reason that keeps the most kernels on the CPU (numbers in reasons become N, so
one op's or dtype's refusals count together).

    python3 benchmarks/gpu/placement_survey.py target/release/rafter [CONFORMANCE_DIR]

CONFORMANCE_DIR defaults to $RAFTER_CONFORMANCE_DIR, else .cache/onnx-conformance. Plans
are compiled without input shapes (symbolic where the model is), so the count of tests with
a GPU kernel differs a little from `rafter conformance --device vulkan`'s, which compiles for
each test's inputs; the reasons are what the survey is for.
"""
import collections
import os
import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def main():
    rafter = sys.argv[1]
    default = os.environ.get("RAFTER_CONFORMANCE_DIR", str(REPO / ".cache/onnx-conformance"))
    root = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else default) / "node"
    failing = {
        line.split()[0]
        for line in open(REPO / "conformance/expected-failures-cpu.txt")
        if line.strip() and not line.startswith("#")
    }
    on_gpu, off, errors = 0, collections.Counter(), 0
    examples = collections.defaultdict(list)
    for test in sorted(root.iterdir()):
        if test.name in failing:
            continue
        try:
            out = subprocess.run(
                [rafter, "plan", str(test / "model.onnx"), "--target", "vulkan"],
                capture_output=True, text=True, timeout=60,
            ).stdout
        except subprocess.TimeoutExpired:
            errors += 1
            continue
        m = re.search(r"placement: (\d+) of (\d+) kernels", out)
        if not m:
            errors += 1
            continue
        if int(m.group(1)) > 0:
            on_gpu += 1
            continue
        lines = out.splitlines()
        try:
            i = lines.index("  why kernels stay on cpu, by count:")
            why = lines[i + 1].split(": ", 1)[1]
        except (ValueError, IndexError):
            why = "(no kernels)"
        why = re.sub(r"\d+", "N", why)
        off[why] += 1
        if len(examples[why]) < 3:
            examples[why].append(test.name)
    print(f"tests with a GPU kernel: {on_gpu}; without: {sum(off.values())}; no plan: {errors}")
    for why, n in off.most_common(40):
        print(f"{n:5d}  {why}   e.g. {', '.join(examples[why])}")


if __name__ == "__main__":
    main()
