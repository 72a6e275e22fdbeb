#!/usr/bin/env python3
"""speed_table.py DIR - the markdown tables of one tools/speed_table.sh run.

Reads the raw files ROW__PROGRAM__LABEL__rN.{json,txt} in DIR and prints,
per row, the median and min-max over the repeats of each program's figure,
and the ratio of the medians. A decode row's ceiling is the one kvtop
measured in the same repeat (bandwidth / weight bytes per token); llama.cpp
reads the same file, so its share is against the same ceiling."""
import glob
import json
import os
import re
import statistics
import sys
from collections import defaultdict


def parse_kvtop_stats(path):
    txt = open(path).read()
    out = {}
    m = re.search(r'^decode\s+\d+ tokens in [\d.]+ s = ([\d.]+) tok/s', txt, re.M)
    if m:
        out['decode'] = float(m.group(1))
    m = re.search(r'^prompt\s+(\d+) tokens in [\d.]+ s = ([\d.]+) tok/s', txt, re.M)
    if m:
        out['prompt_tokens'], out['prefill'] = int(m.group(1)), float(m.group(2))
    m = re.search(r'^bandwidth\s+([\d.]+) GB/s', txt, re.M)
    if m:
        out['gbs'] = float(m.group(1))
    m = re.search(r'^decode ceiling\s+([\d.]+) tok/s', txt, re.M)
    if m:
        out['ceiling'] = float(m.group(1))
    return out


def load_json(path):
    """The file's JSON, or None for a run that was cut short (empty or partial file)."""
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None


def llama_bench_ts(path):
    rows = load_json(path)
    return rows[0]['avg_ts'] if rows else None


def kvtop_bench(path, key):
    d = load_json(path)
    if not d:
        return None
    return 1000.0 / d['tpot_ms']['p50'] if key == 'tpot' else d.get(key)


def batched_s_tg(path):
    """{npl: S_TG} from llama-batched-bench's table |PP|TG|B|N_KV|T_PP|S_PP|T_TG|S_TG|T|S|."""
    out = {}
    for line in open(path):
        cells = [c.strip() for c in line.split('|')]
        if len(cells) > 9 and re.fullmatch(r'\d+', cells[3] or 'x'):
            out[int(cells[3])] = float(cells[8])
    return out


def fmt(vals, digits=0):
    vals = [v for v in vals if v is not None]
    if not vals:
        return '-', None
    med = statistics.median(vals)
    f = f'{{:.{digits}f}}'
    s = f.format(med)
    if len(vals) > 1:
        s += f' ({f.format(min(vals))}-{f.format(max(vals))})'
    return s, med


def ratio(a, b):
    return f'{a / b:.2f}x' if a and b else '-'


def collect(d):
    runs = defaultdict(dict)  # (row, prog, label) -> {rep: path}
    for p in glob.glob(os.path.join(d, '*__*__*__r*.*')):
        row, prog, label, rest = os.path.basename(p).split('__')
        rep = int(rest[1:].split('.')[0])
        runs[(row, prog, label)][rep] = p
    return runs


def decode_table(runs, ids):
    print('| decode, 1 stream (tok/s) | llama.cpp tg128 | kvtop | kvtop / llama.cpp | '
          'ceiling (tok/s) | llama.cpp % of ceiling | kvtop % of ceiling |')
    print('|---|---|---|---|---|---|---|')
    for mid in ids:
        lp, kp = runs.get(('decode', 'llama', mid), {}), runs.get(('decode', 'kvtop', mid), {})
        if not lp and not kp:
            continue
        ll = {r: llama_bench_ts(p) for r, p in lp.items()}
        kv = {r: parse_kvtop_stats(p) for r, p in kp.items()}
        ls, lmed = fmt(ll.values(), 1)
        ks, kmed = fmt([k.get('decode') for k in kv.values()], 1)
        cs, _ = fmt([k.get('ceiling') for k in kv.values()], 1)
        lpc, _ = fmt([100 * ll[r] / kv[r]['ceiling'] for r in ll if r in kv and kv[r].get('ceiling') and ll[r]])
        kpc, _ = fmt([100 * k['decode'] / k['ceiling'] for k in kv.values() if k.get('ceiling') and k.get('decode')])
        print(f'| {mid} | {ls} | {ks} | {ratio(kmed, lmed)} | {cs} | {lpc}% | {kpc}% |')
    gbs = [k.get('gbs') for (row, prog, _), ps in runs.items() if row == 'decode' and prog == 'kvtop'
           for k in map(parse_kvtop_stats, ps.values())]
    s, _ = fmt(gbs, 1)
    n = len([g for g in gbs if g])
    print(f'\nmeasured read bandwidth (kvtop, 2 threads summing 256 MiB, median of 5 per run), '
          f'median (min-max) of {n} runs: {s} GB/s\n')


def prefill_table(runs, ids):
    print('| prefill (tok/s) | llama.cpp pp | kvtop (prompt tokens) | kvtop / llama.cpp |')
    print('|---|---|---|---|')
    for mid in ids:
        lp, kp = runs.get(('prefill', 'llama', mid), {}), runs.get(('prefill', 'kvtop', mid), {})
        if not lp and not kp:
            continue
        ls, lmed = fmt([llama_bench_ts(p) for p in lp.values()])
        kv = [parse_kvtop_stats(p) for p in kp.values()]
        ks, kmed = fmt([k.get('prefill') for k in kv])
        ntok = kv[0].get('prompt_tokens', '?') if kv else '?'
        print(f'| {mid} | {ls} | {ks} ({ntok}) | {ratio(kmed, lmed)} |')
    print()


def conc_table(runs):
    print('| aggregate decode, 110M q8_0 (tok/s) | llama.cpp S_TG, FA on | FA off | best | '
          'kvtop output tok/s (closed loop, prefill included) | kvtop / best | '
          'kvtop decode steps (one wave, as S_TG) | kvtop decode steps / best |')
    print('|---|---|---|---|---|---|---|---|')
    for n in (32, 64):
        on = [batched_s_tg(p).get(n) for p in runs.get(('conc', 'llama', 'fa-on'), {}).values()]
        off = [batched_s_tg(p).get(n) for p in runs.get(('conc', 'llama', 'fa-off'), {}).values()]
        best = [max(a or 0, b or 0) or None for a, b in zip(on + [None] * len(off), off + [None] * len(on))]
        kv = [kvtop_bench(p, 'output_tokens_per_s') for p in runs.get(('conc', 'kvtop', f'c{n}'), {}).values()]
        kw = [kvtop_bench(p, 'decode_step_tokens_per_s') for p in runs.get(('conc', 'kvtop', f'wave{n}'), {}).values()]
        (ons, _), (offs, _), (bs, bmed), (ks, kmed), (ws, wmed) = fmt(on), fmt(off), fmt(best), fmt(kv), fmt(kw)
        print(f'| {n} concurrent | {ons} | {offs} | {bs} | {ks} | {ratio(kmed, bmed)} | {ws} | {ratio(wmed, bmed)} |')
    print()


def long_table(runs):
    print('| decode after D tokens of context (tok/s; the model: run.txt) | llama.cpp FA, f16 KV | llama.cpp FA, q8_0 KV | '
          'kvtop f16 KV | kvtop int8 KV | kvtop fp8_e4m3 KV | kvtop f16 / llama.cpp f16 | '
          'kvtop int8 / kvtop f16 |')
    print('|---|---|---|---|---|---|---|---|')
    depths = sorted({int(re.match(r'd(\d+)', lab).group(1)) for (row, _, lab) in runs if row == 'long'})
    for d in depths:
        cells, med = [], {}
        for prog, kt in (('llama', 'f16'), ('llama', 'q8_0'), ('kvtop', 'f16'), ('kvtop', 'int8'),
                         ('kvtop', 'fp8_e4m3')):
            ps = runs.get(('long', prog, f'd{d}-{kt}'), {}).values()
            if prog == 'llama':
                vals = [llama_bench_ts(p) for p in ps]
            else:
                vals = [kvtop_bench(p, 'tpot') for p in ps]
            s, med[(prog, kt)] = fmt(vals, 1)
            cells.append(s)
        r1 = ratio(med[('kvtop', 'f16')], med[('llama', 'f16')])
        r2 = ratio(med[('kvtop', 'int8')], med[('kvtop', 'f16')])
        print(f'| {d} | ' + ' | '.join(cells) + f' | {r1} | {r2} |')
    print()


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit('usage: speed_table.py DIR (a tools/speed_table.sh output folder)')
    d = sys.argv[1]
    runs = collect(d)
    rows = {k[0] for k in runs}
    for name in ('run.txt', 'uptime-start.txt', 'uptime-end.txt'):
        p = os.path.join(d, name)
        if os.path.exists(p):
            print(f'{name}: ' + ' / '.join(line.strip() for line in open(p)))
    print()
    decode_ids = ['110m-f32', '110m-f16', '110m-q8_0', '110m-q4_0', '110m-q4_1', '110m-q4_k_m',
                  '1b-q8_0', '1b-q4_0', '1b-q4_k_m', 'smollm2', 'gemma3']
    if 'decode' in rows:
        decode_table(runs, decode_ids)
    if 'prefill' in rows:
        prefill_table(runs, ['110m-q8_0', '110m-q4_0', '110m-f32', 'stories260k'])
    if 'conc' in rows:
        conc_table(runs)
    if 'long' in rows:
        long_table(runs)


if __name__ == '__main__':
    main()
