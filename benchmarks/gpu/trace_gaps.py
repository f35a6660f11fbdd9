#!/usr/bin/env python3
"""Where a traced call's time goes between kernels: the timeline of one call as runs of
back-to-back work per device, with the gaps between them.

    python3 benchmarks/gpu/trace_gaps.py TRACE.json CALLS [GAP_US]

TRACE.json comes from `rafter bench ... --trace`, which ran CALLS calls one after another.
The last call's window (the trace's span / CALLS, at its end) is printed: each run of
events on one device with no gap above GAP_US (default 20 µs) inside it, and the idle
time before it. GPU events are placed by the GPU's own timestamps relative to the end of
their submission (see rafter-hal-vulkan's queue.rs), so cross-device offsets are only as
exact as that anchor.
"""
import json
import sys

if len(sys.argv) not in (3, 4) or not sys.argv[2].isdigit() or int(sys.argv[2]) < 1:
    sys.exit("usage: trace_gaps.py TRACE.json CALLS [GAP_US]  (CALLS: a positive integer)")
trace, calls = sys.argv[1], int(sys.argv[2])
gap_us = float(sys.argv[3]) if len(sys.argv) > 3 else 20.0
try:
    events = json.load(open(trace))["traceEvents"]
except (OSError, ValueError, KeyError) as e:
    sys.exit(f"trace_gaps.py: {trace}: not a rafter Chrome trace ({e})")
if not any(e.get("ph") == "X" for e in events):
    sys.exit(f"trace_gaps.py: {trace}: no timed events")
names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
spans = sorted((e["ts"], e["ts"] + e["dur"], names.get(e["pid"], e["pid"]), e["name"])
               for e in events if e.get("ph") == "X")
t0, t1 = spans[0][0], max(s[1] for s in spans)
window = (t1 - t0) / calls
start = t1 - window
last = [s for s in spans if s[0] >= start]
runs = []
for s in last:
    r = runs[-1] if runs else None
    if r and r["device"] == s[2] and s[0] - r["end"] <= gap_us:
        r["end"] = max(r["end"], s[1]); r["n"] += 1; r["last"] = s[3]; r["busy"] += s[1] - s[0]
    else:
        runs.append({"device": s[2], "start": s[0], "end": s[1], "n": 1, "first": s[3],
                     "last": s[3], "busy": s[1] - s[0]})
base = last[0][0]
prev_end = base
print(f"last of {calls} calls: {len(last)} events in a {window / 1000:.3f} ms window")
for r in runs:
    idle = r["start"] - prev_end
    print(f"{r['start'] - base:9.1f} us  +{idle:8.1f} idle  {r['device']:>14}  {r['n']:4} events "
          f"{r['end'] - r['start']:8.1f} us (busy {r['busy']:8.1f})  {r['first']} .. {r['last']}")
    prev_end = max(prev_end, r["end"])
