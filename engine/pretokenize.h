/* pretokenize.h - the pre-tokenizers of BPE: the GPT-2 family of splitting
 * rules and the DeepSeek and Gemma 4 ones (hand-written matchers over
 * generated Unicode classes, no regex library) that cut text into words
 * before the merges.
 * Private to engine/ (the tokenizer's loader picks the kind, its encoder
 * runs it). */
#ifndef KV_PRETOKENIZE_H
#define KV_PRETOKENIZE_H

#include <stddef.h>
#include <stdint.h>

/* Pre-tokenizer pipelines (BPE). Each is a list of split steps applied in
 * turn, every step refining the pieces of the previous one, the way
 * llama.cpp applies its list of regexes. */
typedef enum kv_pre_kind {
    KV_PRE_DEFAULT,   /* llama.cpp's default: [\p{P}$+<=>^~|]+, GPT-2, \p{N}+, [0-9]{3} */
    KV_PRE_GPT2,      /* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    KV_PRE_STARCODER, /* \p{N} (each digit alone), then GPT-2 (starcoder, smollm, ...) */
    KV_PRE_LLAMA3,    /* Llama 3: (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    KV_PRE_QWEN2,     /* as Llama 3 with \p{N} instead of \p{N}{1,3} */
    KV_PRE_FALCON,    /* [\p{P}$+<=>^~|`]+, GPT-2, [0-9]{3} */
    KV_PRE_QWEN35,    /* as Qwen 2 with combining marks joining letter runs: [\p{L}\p{M}]+ */
    KV_PRE_DEEPSEEK_LLM,   /* [\r\n], \s?[Latin/Greek/Cyrillic/... letters]+, \s?[ASCII and CJK punctuation]+,
                              \s+$, [CJK and Hangul]+, \p{N}+ (DeepSeek LLM's tokenizer.json) */
    KV_PRE_DEEPSEEK_CODER, /* [\r\n], \s?\p{L}+, \s?\p{P}+, [CJK and Hangul]+, \p{N} */
    KV_PRE_GEMMA4     /* [^\n]+|[\n]+ only: Gemma 4's BPE runs on whole lines of raw UTF-8 */
} kv_pre_kind;

/* The pipeline for a tokenizer.ggml.pre name, as llama.cpp maps them;
 * KV_PRE_DEFAULT for a name it does not know. */
kv_pre_kind kv_pre_kind_from_name(const char *name);
/* 1 when name is one of those names ("default" included), 0 otherwise. */
int kv_pre_name_known(const char *name);

/* Splits code points [0, n) into words with pipeline `kind`. cp holds the
 * code points (KV_UTF8_INVALID for a stray byte), fl their KV_UCAT_* flags;
 * pa and pb are scratch of n + 1 entries each. Returns the word count and
 * points *pieces at their lengths in code points (pa or pb). n >= 1. */
size_t kv_pretokenize(kv_pre_kind kind, const uint32_t *cp, const uint16_t *fl, size_t n, size_t *pa, size_t *pb,
                      size_t **pieces /* OUT: word lengths */);

#endif
