"""Summarises a `rafter bench --trace` Chrome trace: per device, the busy time per call and
the kernels that take most of it, so GPU time can be told apart from host time.

python3 benchmarks/gpu/trace_summary.py TRACE.json CALLS [TOP]
"""
import collections
import json
import re
import sys


def main():
    path, calls = sys.argv[1], int(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    data = json.load(open(path))
    events = data["traceEvents"] if isinstance(data, dict) else data
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e["pid"]] = e["args"]["name"]
    busy = collections.Counter()
    per_kernel = collections.defaultdict(lambda: [0, 0.0])
    per_class = collections.Counter()
    for e in events:
        if e.get("ph") != "X":
            continue
        dev = names.get(e.get("pid"), str(e.get("pid")))
        busy[dev] += e["dur"]
        per_kernel[(dev, e["name"])][0] += 1
        per_kernel[(dev, e["name"])][1] += e["dur"]
        per_class[(dev, re.sub(r"^k\d+_", "", e["name"]))] += e["dur"]
    for dev, us in busy.items():
        print(f"{dev}: busy {us / calls / 1000:.3f} ms per call")
    for (dev, cls), us in sorted(per_class.items(), key=lambda x: -x[1]):
        print(f"  {dev} {cls}: {us / calls / 1000:.3f} ms per call")
    for (dev, name), (n, us) in sorted(per_kernel.items(), key=lambda x: -x[1][1])[:top]:
        print(f"  {dev} {name}: {us / calls:.1f} us per call")


if __name__ == "__main__":
    main()
