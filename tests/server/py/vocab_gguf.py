"""vocab_gguf.py OUT [PRE] - writes a GGUF holding only a byte-level BPE
vocabulary (256 byte tokens, one merge) whose tokenizer.ggml.pre is PRE
(default "frobnicator-9", one kvtop does not know), for
`kvtop mkmodel --vocab-from`: a model that loads with a tokenizer warning.
"""
import struct
import sys


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv_str(key, val):
    return gguf_str(key) + struct.pack("<I", 8) + gguf_str(val)


def kv_str_arr(key, vals):
    return gguf_str(key) + struct.pack("<IIQ", 9, 8, len(vals)) + b"".join(gguf_str(v) for v in vals)


# GPT-2's byte -> printable character mapping
printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
extra = 0
tokens = []
for b in range(256):
    if b in printable:
        tokens.append(chr(b))
    else:
        tokens.append(chr(256 + extra))
        extra += 1
kvs = [kv_str("tokenizer.ggml.model", "gpt2"),
       kv_str("tokenizer.ggml.pre", sys.argv[2] if len(sys.argv) > 2 else "frobnicator-9"),
       kv_str_arr("tokenizer.ggml.tokens", tokens),
       kv_str_arr("tokenizer.ggml.merges", ["a b"])]
data = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)
data += b"\0" * (-len(data) % 32)
with open(sys.argv[1], "wb") as f:
    f.write(data)
