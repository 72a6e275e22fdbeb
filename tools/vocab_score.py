#!/usr/bin/env python3
"""vocab_score.py - scores `kvtop tokenize` against llama.cpp's vocabulary test sets.

For every ggml-vocab-SET.gguf in DIR with SET.gguf.inp / .out (strings separated by
"\\n__ggml_vocab_test__\\n", one line of reference ids per string), runs
`kvtop tokenize -m SET.gguf --no-bos -f FILE` on each string, exactly as the acceptance check does,
and counts the strings whose ids match. Prints a Markdown table (set, tokenizer, strings, exact) and,
with -v, each mismatch (the string, the expected and the produced ids). Exit 0 only when every string
of every set matches.

--fast runs one process per set instead (`kvtop tokenize --split SEP -f SET.gguf.inp`): the same
encoder on the same strings, without loading the vocabulary once per string; make test uses it.

usage: tools/vocab_score.py DIR [--kvtop ./kvtop] [--sets a,b] [--fast] [-v] [-j N]
DIR is what tools/vocab_fetch.sh prints.
"""
import argparse
import concurrent.futures as cf
import os
import re
import subprocess
import sys
import tempfile


def load_set(d, f):
    inp = open(os.path.join(d, f + ".inp"), encoding="utf-8").read().split("\n__ggml_vocab_test__\n")
    out = open(os.path.join(d, f + ".out"), encoding="utf-8").read().split("\n")
    if inp and out and inp[-1] == "" and out[-1] == "":
        inp, out = inp[:-1], out[:-1]
    return inp, out


def run_one(kvtop, model, text):
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", delete=False, suffix=".txt") as t:
        t.write(text)
    try:
        r = subprocess.run([kvtop, "tokenize", "-m", model, "--no-bos", "-f", t.name],
                           capture_output=True, text=True, errors="replace", timeout=60)
        return r.stdout, r.stderr
    except Exception as e:  # a crash or a hang counts as a miss
        return "", str(e)
    finally:
        os.unlink(t.name)


def run_set(kvtop, model, n):
    """Every string of model's .inp in one process: n results, each (stdout line, stderr)."""
    r = subprocess.run([kvtop, "tokenize", "-m", model, "--no-bos", "-f", model + ".inp",
                        "--split", "\\n__ggml_vocab_test__\\n"], capture_output=True, text=True, errors="replace", timeout=600)
    lines = r.stdout.split("\n")
    return [(lines[i] if i < len(lines) else "", r.stderr) for i in range(n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--kvtop", default="./kvtop")
    ap.add_argument("--sets", default="")
    ap.add_argument("-v", action="store_true")
    ap.add_argument("--fast", action="store_true")
    ap.add_argument("-j", type=int, default=2)
    a = ap.parse_args()
    want = set(s for s in a.sets.split(",") if s)
    files = [f for f in sorted(os.listdir(a.dir)) if f.endswith(".gguf")
             and os.path.exists(os.path.join(a.dir, f + ".out"))]
    rows, bad = [], 0
    for f in files:
        name = f.replace("ggml-vocab-", "").replace(".gguf", "")
        if want and name not in want:
            continue
        inp, out = load_set(a.dir, f)
        model = os.path.join(a.dir, f)
        if a.fast:
            res = run_set(a.kvtop, model, len(inp))
        else:
            with cf.ThreadPoolExecutor(max_workers=a.j) as ex:
                res = list(ex.map(lambda s: run_one(a.kvtop, model, s), inp))
        ok = 0
        for text, ids, (got, err) in zip(inp, out, res):
            if re.findall(r"-?\d+", got) == ids.split():
                ok += 1
            elif a.v:
                print(f"[{name}] {text!r}\n   want {ids}\n   got  {got.strip()} {err.strip()[:200]}")
        rows.append((name, ok, len(inp)))
        bad += ok != len(inp)
    print("| set | strings | exact |")
    print("|---|---:|---:|")
    for name, ok, n in rows:
        print(f"| {name} | {n} | {ok}{'' if ok == n else ' (short)'} |")
    print(f"tokenizers: {len(rows) - bad}/{len(rows)} sets exact")
    return 0 if rows and not bad else 1


if __name__ == "__main__":
    sys.exit(main())
