"""Summarises a `rafter generate ... --trace FILE` Chrome trace per decode call.

Usage: python3 benchmarks/trace_calls.py TRACE.json [TOP]

Calls are split where the program's first kernel (the first event's name) runs again; the
first call (the prompt) is left out. Per decode call it prints the median wall span (first
dispatch start to last dispatch end), the median union of dispatch intervals (time some
command thread ran a kernel) and their difference, the idle gaps between dispatches (the
hand-off cost this script exists to measure); how many dispatches each command thread
(`-host` is the caller helping, `-worker-N` the device's command workers) ran; and the
time per call by op (kernel names `kN_op`; the last `linear`, the LM head, on its own).
Spans of dispatches that ran side by side overlap, so per-op times can add up to more
than the span. On a loaded machine the gaps include time slices lost to other processes.
"""
import collections
import json
import re
import statistics
import sys


def calls_of(events):
    """Events (complete spans, in start order) cut into calls at the first kernel's name."""
    first = events[0]['name']
    calls, cur = [], [events[0]]
    for e in events[1:]:
        if e['name'] == first:
            calls.append(cur)
            cur = [e]
        else:
            cur.append(e)
    calls.append(cur)
    return calls


def busy_union(call):
    """Microseconds in which at least one dispatch of `call` ran."""
    spans = sorted((e['ts'], e['ts'] + e['dur']) for e in call)
    total, (a, b) = 0, spans[0]
    for x, y in spans[1:]:
        if x > b:
            total += b - a
            a, b = x, y
        else:
            b = max(b, y)
    return total + b - a


def main():
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    events = [e for e in json.load(open(sys.argv[1]))['traceEvents'] if e.get('ph') == 'X']
    events.sort(key=lambda e: e['ts'])
    decode = calls_of(events)[1:]
    if not decode:
        sys.exit('trace_calls: the trace holds one call only (no decode step)')
    spans = [max(e['ts'] + e['dur'] for e in c) - min(e['ts'] for e in c) for c in decode]
    busy = [busy_union(c) for c in decode]
    idle = [s - b for s, b in zip(spans, busy)]
    lm_head = max((e['name'] for e in decode[0] if e['name'].endswith('_linear')),
                  key=lambda n: int(re.match(r'k(\d+)_', n).group(1)), default=None)
    per_op, threads = collections.defaultdict(float), collections.Counter()
    for c in decode:
        for e in c:
            op = 'lm_head' if e['name'] == lm_head else re.sub(r'^k\d+_', '', e['name'])
            per_op[op.split('#')[0]] += e['dur']
            threads[e['args']['thread']] += 1
    n = len(decode)
    print(f'decode calls {n}, dispatches per call {statistics.median(len(c) for c in decode)}')
    print(f'per call (median): span {statistics.median(spans) / 1e3:.2f} ms, '
          f'kernels running {statistics.median(busy) / 1e3:.2f} ms, '
          f'idle gaps {statistics.median(idle) / 1e3:.2f} ms')
    print('dispatches by thread: ' + ', '.join(f'{t} {k}' for t, k in threads.most_common()))
    for op, us in sorted(per_op.items(), key=lambda kv: -kv[1])[:top]:
        print(f'  {op:20s} {us / n / 1e3:7.3f} ms per call')


if __name__ == '__main__':
    main()
