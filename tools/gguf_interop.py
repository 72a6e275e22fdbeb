#!/usr/bin/env python3
"""gguf_interop.py - reads kvtop's quantized GGUF files with gguf-py (the
llama.cpp project's Python GGUF library, an implementation independent of
kvtop's) and checks every tensor dequantizes to exactly what kvtop's own
dequantizer wrote into the matching f32 file.

    gguf_interop.py QUANT.gguf F32.gguf [QUANT.gguf F32.gguf ...]

Prints one line per pair; exit status 0 when every tensor matches bit for
bit, 1 on a difference, 2 when gguf-py or numpy is missing."""
import sys

try:
    import numpy as np
    import gguf
    from gguf.quants import dequantize
except ImportError as e:  # the caller reports this as a skip
    print(f"gguf-py missing: {e}")
    sys.exit(2)

bad = 0
args = sys.argv[1:]
for qpath, fpath in zip(args[0::2], args[1::2]):
    q, f = gguf.GGUFReader(qpath), gguf.GGUFReader(fpath)
    ref = {t.name: t for t in f.tensors}
    types, worst, missing = set(), 0.0, []
    for t in q.tensors:
        types.add(t.tensor_type.name)
        if t.name not in ref:
            missing.append(t.name)
            continue
        a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
        b = np.asarray(ref[t.name].data, dtype=np.float32).reshape(-1)
        if a.shape != b.shape:
            missing.append(f"{t.name} (shape {a.shape} vs {b.shape})")
            continue
        if a.size:
            worst = max(worst, float(np.max(np.abs(a - b))))
    ok = worst == 0.0 and not missing and len(q.tensors) == len(f.tensors)
    bad |= not ok
    print(f"{qpath}: {len(q.tensors)} tensors, types {','.join(sorted(types))}; "
          f"max |gguf-py - kvtop| = {worst:g}{'; missing ' + ', '.join(missing) if missing else ''}")
sys.exit(1 if bad else 0)
