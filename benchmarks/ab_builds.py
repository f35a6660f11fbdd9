"""Alternate `rafter bench` of two builds of rafter for a before/after ratio.

Usage: BASE=path/to/old/rafter NEW=path/to/new/rafter ART=dir \
       python3 benchmarks/ab_builds.py ROUNDS MODEL...

Each build must have compiled its own artifacts as ART/base_MODEL.rfa and ART/new_MODEL.rfa
(`rafter compile .cache/models/MODEL.onnx -o ...`, with `--dim batch=1 --dim seq=128` for
the transformers). Every round runs both builds, swapping which goes first, and prints their
medians; the last line per model gives the median ratio new/base and how often new won.
"""
import os, re, statistics, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = {'base': os.environ['BASE'], 'new': os.environ['NEW']}
ART = os.environ.get('ART', '/tmp/rafter_ab')
TEXT_INPUTS = ['attention_mask', 'input_ids', 'token_type_ids']
INPUTS = {'minilm_l6': TEXT_INPUTS, 'bert_base': TEXT_INPUTS}
ITERS = {'bert_base': 20, 'resnet50': 50, 'minilm_l6': 100}


def bench(which, model):
    args = [BIN[which], 'bench', f'{ART}/{which}_{model}.rfa', '--threads', '2',
            '--warmup', '20', '--iters', str(ITERS.get(model, 200))]
    for n in INPUTS.get(model, []):
        args += ['--input', f'{n}={ROOT}/.cache/models/{model}_inputs/{n}.npy']
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    return float(re.search(r'bench: median ([0-9.]+) ms', out.stdout + out.stderr).group(1))


def main():
    rounds = int(sys.argv[1])
    for model in sys.argv[2:]:
        ratios, rows = [], []
        for r in range(rounds):
            order = ['base', 'new'] if r % 2 == 0 else ['new', 'base']
            t = {w: bench(w, model) for w in order}
            ratios.append(t['new'] / t['base'])
            rows.append((t['base'], t['new']))
            print(f'{model} round {r + 1}: base {t["base"]:.3f} new {t["new"]:.3f} '
                  f'new/base {ratios[-1]:.3f}', flush=True)
        wins = sum(1 for x in ratios if x < 1)
        print(f'{model}: median base {statistics.median(b for b, _ in rows):.3f} ms, '
              f'new {statistics.median(n for _, n in rows):.3f} ms, median new/base '
              f'{statistics.median(ratios):.3f}, new faster in {wins} of {rounds}', flush=True)


if __name__ == '__main__':
    main()
