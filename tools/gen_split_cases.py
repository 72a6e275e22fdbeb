#!/usr/bin/env python3
"""gen_split_cases.py - prints the expected pre-tokenizer splits used by
tests/engine/test_tokenizer.c (tests/fixtures/tokenizer_splits.tsv), computed
with Python's third-party `regex` module from the pattern lists llama.cpp
applies for each tokenizer.ggml.pre value. Each pattern refines the pieces of
the previous one; within a piece both the matches and the text between them
become pieces.

Usage: python3 tools/gen_split_cases.py > tests/fixtures/tokenizer_splits.tsv"""
import regex

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
QWEN35 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
          r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def char_class(ranges):
    """A regex character class of code point ranges (kept ASCII here)."""
    return "[" + "".join(regex.escape(chr(a)) + ("-" + regex.escape(chr(b)) if b != a else "") for a, b in ranges) + "]"


# DeepSeek LLM's tokenizer.json letter and punctuation classes, as code point ranges.
DS_LETTERS = char_class([
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA), (0x1BC, 0x1BF),
    (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x377), (0x37B, 0x37D), (0x37F, 0x37F),
    (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C), (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481),
    (0x48A, 0x52F), (0x531, 0x556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B), (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE), (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102),
    (0x2107, 0x2107), (0x210A, 0x2113), (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126),
    (0x2128, 0x2128), (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F), (0x2145, 0x2149),
    (0x214E, 0x214E), (0x2183, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF3),
    (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F), (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF),
    (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A), (0x10400, 0x1044F),
    (0x104B0, 0x104D3), (0x104D8, 0x104FB), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF),
    (0x1E900, 0x1E943)])
DS_PUNCT = char_class([(0x21, 0x2F), (0x3A, 0x7E), (0xFF01, 0xFF0F), (0xFF1A, 0xFF5E), (0x2018, 0x201F),
                       (0x3000, 0x3002)])
CJK = char_class([(0x4E00, 0x9FA5), (0x800, 0x4E00), (0xAC00, 0xD7FF)])
PIPELINES = {
    "gpt-2": [GPT2],
    "starcoder": [r"\p{N}", GPT2],
    "llama-bpe": [LLAMA3],
    "qwen2": [QWEN2],
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
    "qwen35": [QWEN35],
    "deepseek-llm": [r"[\r\n]", r"\s?" + DS_LETTERS + "+", r"\s?" + DS_PUNCT + "+", r"\s+$", CJK + "+", r"\p{N}+"],
    "deepseek-coder": [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK + "+", r"\p{N}"],
    "gemma4": [r"[^\n]+|[\n]+"],
}
TEXTS = [
    "Hello world", " Hello  world", "I'm you're THEY'RE we'VE it'll", "a\n\nb", "  \n  x", "x   y",
    "1234567", " 12 345", "a1b2", "日本語 テスト", "naïve café", "!!!  ???", "foo\r\n\r\nbar", "\t\tx",
    "(hello) [x]", "'s 'S 'll '", "x  ", "3.14159", "Ω≈ç√ ⅷ", "😀😀 hi", "a\u00a0b\u2003c", "٣٤٥ ٦",
    "int main() {\n    return 0;\n}\n", "$x += <y> ^ ~z | `w`", "a \nb", "  ", "\n", "e.g. U.S.A.",
    "\u1780\u17b6\u1793\u17cb\u178f\u17c2 \u1796\u17b7", "Cu\u0309a Vi\u1ec7t", "\uff28\uff45\uff4c\uff4c\uff4f\uff01 x",
    "a\u3000b\u3001c", "tail  \n", "\u2705 3.5 \u2026", "\uc548\ub155 \ud558\uc138\uc694", "\u03b1\u03b2\u03b3 \u0436\u0436",
]


def split(text, patterns):
    pieces = [text]
    for pat in patterns:
        rx = regex.compile(pat)
        out = []
        for p in pieces:
            last = 0
            for m in rx.finditer(p):
                if m.start() > last:
                    out.append(p[last:m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                last = m.end()
            if last < len(p):
                out.append(p[last:])
        pieces = out
    return pieces


def esc(s):
    """One field of the table: printable ASCII as is, every other byte
    (and the backslash) as \\xNN, so a line holds no tab or newline."""
    out = []
    for b in s.encode("utf-8"):
        if b == 0x5C or not 32 <= b < 127:
            out.append("\\x%02x" % b)
        else:
            out.append(chr(b))
    return "".join(out)


print("# tokenizer_splits.tsv - GENERATED by tools/gen_split_cases.py (Python `regex` module):")
print("# expected pre-tokenizer pieces. Per line: pipeline, text, pieces joined by \\x01;")
print("# tab-separated, bytes outside printable ASCII and the backslash written \\xNN.")
for pre, pats in PIPELINES.items():
    for t in TEXTS:
        ps = split(t, pats)
        assert "".join(ps) == t and "\x01" not in t and "\t" not in pre
        print("%s\t%s\t%s" % (esc(pre), esc(t), esc("\x01".join(ps))))
