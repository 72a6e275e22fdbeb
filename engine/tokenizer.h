/* tokenizer.h - text <-> token ids for the vocabulary families kvtop
 * reads: SentencePiece-style (GGUF tokenizer.ggml.model "llama", and
 * llama2.c tokenizer.bin files) with score-driven merges and byte fallback;
 * byte-level BPE (model "gpt2") with ranked merges and a pre-tokenizer
 * chosen by tokenizer.ggml.pre; Gemma 4's BPE over raw UTF-8 (model
 * "gemma4"); and WordPiece (model "bert"). Also a streaming detokenizer
 * that never emits half a UTF-8 character.
 *
 * The output matches the reference ids of every vocabulary test set
 * llama.cpp ships (tools/vocab_score.py) and of ../shared/vocab. A kv_tokenizer is immutable after creation, so one handle
 * may be used from several threads at once. */
#ifndef KV_TOKENIZER_H
#define KV_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "../base/common.h"
#include "gguf.h"

typedef struct kv_tokenizer kv_tokenizer; /* opaque */

/* Vocabulary family. */
typedef enum kv_tok_type {
    KV_TOK_SPM = 1, /* SentencePiece-style: scores, "▁" for space, <0xNN> byte tokens */
    KV_TOK_BPE = 2, /* BPE with ranked merges: byte-level (GPT-2 byte-to-unicode map), or over raw UTF-8
                       with "▁" spaces and <0xNN> byte fallback (Gemma 4) */
    KV_TOK_WPM = 3  /* WordPiece (BERT): lowercased, accent-stripped words, greedy longest match; lossy */
} kv_tok_type;

/* GGUF tokenizer.ggml.token_type values. */
enum {
    KV_TOKEN_NORMAL = 1,
    KV_TOKEN_UNKNOWN = 2,
    KV_TOKEN_CONTROL = 3,      /* <s>, </s>, <|im_start|> ...: matched in text only with parse_special */
    KV_TOKEN_USER_DEFINED = 4, /* always matched in text, decoded verbatim */
    KV_TOKEN_UNUSED = 5,
    KV_TOKEN_BYTE = 6          /* SPM <0xNN> byte-fallback tokens */
};

/* Builds a tokenizer from the tokenizer.* keys of a GGUF file (tokens,
 * scores, token_type, merges, pre, special ids, add_bos_token,
 * add_space_prefix, chat_template). Copies what it needs: g may be closed
 * afterwards. Needs no tensors, so vocab-only files work. On error returns
 * NULL and fills err (missing or malformed key, unsupported model). */
kv_tokenizer *kv_tokenizer_from_gguf(const kv_gguf *g, kv_err *err);

/* Reads a llama2.c tokenizer.bin (int32 max_token_length, then per token:
 * float32 score, int32 length, bytes). vocab_size > 0 reads exactly that many
 * tokens (the model header's vocab_size); vocab_size <= 0 reads to the end of
 * the file. The vocab is treated as SentencePiece: id 0 <unk>, 1 <s> (BOS),
 * 2 </s> (EOS) (stored as "\n<s>\n" / "\n</s>\n" in the file), "<0xNN>"
 * pieces are byte tokens, and spaces are mapped back to "▁". */
kv_tokenizer *kv_tokenizer_from_llama2c(const char *path, int vocab_size, kv_err *err);

void kv_tokenizer_free(kv_tokenizer *t); /* NULL is a no-op */

kv_tok_type kv_tokenizer_type(const kv_tokenizer *t);
/* One-line description for display: "SentencePiece (llama)", "SentencePiece
 * (llama2.c)", "byte-level BPE (gpt2, pre smollm)", "WordPiece (bert,
 * lowercase, strip accents)". Borrowed. */
const char *kv_tokenizer_kind(const kv_tokenizer *t);
int kv_tokenizer_n_vocab(const kv_tokenizer *t);
int32_t kv_tokenizer_bos(const kv_tokenizer *t); /* -1 if none */
int32_t kv_tokenizer_eos(const kv_tokenizer *t); /* -1 if none */
int32_t kv_tokenizer_unk(const kv_tokenizer *t); /* -1 if none */
/* 1 when id ends generation: EOS, EOT/EOM, and end-of-turn tokens found by
 * text (<|im_end|>, <|eot_id|>, <|end|>, <end_of_turn>, <|endoftext|>, ...). */
int kv_tokenizer_is_eog(const kv_tokenizer *t, int32_t id);
/* Whether prompts should start with BOS (tokenizer.ggml.add_bos_token;
 * default 1 for SPM and llama3-style BPE, 0 for other BPE; always 1 for
 * Gemma 4; WordPiece: its [CLS]). */
int kv_tokenizer_add_bos(const kv_tokenizer *t);
/* Whether SPM text gets a leading space ("dummy prefix") before encoding
 * (tokenizer.ggml.add_space_prefix, default 1 for SPM; always 0 for BPE). */
int kv_tokenizer_add_space_prefix(const kv_tokenizer *t);
/* tokenizer.ggml.pre ("" when absent; "gemma4" for that model) and the
 * model name ("llama", "gpt2", "gemma4", "bert", "llama2.c"). Borrowed; valid until kv_tokenizer_free. */
const char *kv_tokenizer_pre(const kv_tokenizer *t);
const char *kv_tokenizer_model(const kv_tokenizer *t);
/* tokenizer.chat_template (NUL-terminated copy) or NULL when the file has
 * none. Borrowed; valid until kv_tokenizer_free. */
const char *kv_tokenizer_chat_template(const kv_tokenizer *t);
/* What the loader had to guess, for a front end to show once ("" when
 * nothing): an unknown tokenizer.ggml.pre, named with the pre-tokenizer
 * used instead. Borrowed; valid until kv_tokenizer_free. */
const char *kv_tokenizer_warning(const kv_tokenizer *t);

/* Encodes len bytes of text. add_bos: prepend BOS (KV_ERR_INVAL when the
 * vocab has none). parse_special: control and unknown-type token texts in the
 * text (e.g. "<|im_start|>", "<s>") become those tokens; user-defined tokens
 * are matched either way, as llama.cpp does. Writes up to cap ids to out and
 * returns the total number of ids (> cap means: call again with a bigger
 * buffer), or a negative KV_ERR_* with err filled. Arbitrary bytes never
 * fail: invalid UTF-8 goes through SPM or Gemma 4 byte fallback or BPE
 * byte-level encoding and decodes back to the same bytes. WordPiece is
 * lossy by design (it lowercases, strips accents, drops whitespace,
 * control and invalid bytes). */
int kv_tokenizer_encode(const kv_tokenizer *t, const char *text, size_t len, int add_bos,
                        int parse_special, int32_t *out /* OUT: (cap) ids */, int cap, kv_err *err);

/* A byte range of a text. */
typedef struct kv_tok_span {
    size_t off, len;
} kv_tok_span;

/* How kv_tokenizer_encode_ex encodes; zero means off. */
typedef struct kv_encode_opts {
    int add_bos;               /* bool: prepend BOS (KV_ERR_INVAL when the vocab has none) */
    int parse_special;         /* bool: control and unknown-type token texts anywhere in the text become
                                  those tokens (as kv_tokenizer_encode's flag) */
    const kv_tok_span *special; /* (n_special) byte ranges, ascending and disjoint, where those texts
                                  become tokens even without parse_special: a chat template's own markers
                                  (kv_chat_tokenize). A match must lie wholly inside them; text outside
                                  stays plain. NULL when n_special is 0 */
    int n_special;
    int max_tokens;            /* > 0: the most ids wanted (BOS included). A text that needs more fails
                                  with KV_ERR_RANGE as soon as that is certain, after work bounded by
                                  max_tokens rather than by the text's length (a 10 MB text against a
                                  4096 limit is refused without being encoded). NOTE: WordPiece drops
                                  whitespace, so no byte count bounds its ids: it stops at the limit
                                  but scans the text for special tokens first (linear). 0: no limit */
} kv_encode_opts;

/* kv_tokenizer_encode with options. The ids are exactly kv_tokenizer_encode's
 * when the options are its two flags; the special ranges only decide where
 * control-token texts may match, so text with no special-token text in it
 * encodes the same either way. Returns the total number of ids (> cap: call
 * again with a bigger buffer), KV_ERR_RANGE with err "... longer than N
 * tokens" when over max_tokens, or another negative KV_ERR_* (ranges out of
 * order or past the text: KV_ERR_INVAL). */
int kv_tokenizer_encode_ex(const kv_tokenizer *t, const char *text, size_t len, const kv_encode_opts *o,
                           int32_t *out /* OUT: (cap) ids */, int cap, kv_err *err);

/* The pre-tokenizer's view of text, for debugging and tests: the byte
 * lengths of the pieces encoding works on, in order and covering all of
 * text. A special token is one piece; for BPE each word of the split
 * pattern is one piece; for SPM (which has no pre-tokenizer) and WordPiece
 * each stretch of text between special tokens is one. Writes up to cap lengths and
 * returns the count, or a negative KV_ERR_*. */
int kv_tokenizer_split(const kv_tokenizer *t, const char *text, size_t len, int parse_special,
                       int32_t *lens /* OUT: (cap) */, int cap, kv_err *err);

/* Bytes token id decodes to: SPM "▁" -> " " and <0xNN> -> that byte, BPE
 * byte-level unmapping. Control and unknown-type tokens decode to their text
 * only if include_special (else to nothing); user-defined tokens always to
 * their text. Writes up to cap bytes (no NUL) and returns the piece's full
 * length (> cap means it was cut), or KV_ERR_RANGE for an id out of range. */
int kv_tokenizer_piece(const kv_tokenizer *t, int32_t id, int include_special, char *buf /* OUT: (cap) */,
                       size_t cap);
/* Upper bound of any piece's length in bytes. */
int kv_tokenizer_max_piece(const kv_tokenizer *t);

/* Raw vocab string of id (NUL-terminated; "▁Hello", "Ġworld", "<0x0A>"), or
 * NULL when out of range. Borrowed; valid until kv_tokenizer_free. */
const char *kv_tokenizer_token_text(const kv_tokenizer *t, int32_t id);
/* GGUF token type (KV_TOKEN_*) of id, or 0 when out of range. */
int kv_tokenizer_token_type(const kv_tokenizer *t, int32_t id);
/* SPM score of id (0 for BPE or out of range). */
float kv_tokenizer_score(const kv_tokenizer *t, int32_t id);
/* Exact vocab entry for text, or -1. */
int32_t kv_tokenizer_find(const kv_tokenizer *t, const char *text);

/* Decodes a whole sequence: the pieces concatenated, except that for a
 * tokenizer that adds a space prefix the first piece of the sequence, or the
 * first after a BOS, drops one leading space (so decode(encode(s)) == s).
 * Like snprintf: writes at most cap bytes including a terminating NUL (when
 * cap > 0) and returns the full length excluding the NUL (>= cap means the
 * text was cut), or a negative KV_ERR_* for a bad id. */
int kv_tokenizer_decode(const kv_tokenizer *t, const int32_t *ids, int n, int include_special,
                        char *buf /* OUT: (cap) */, size_t cap);

/* --- streaming detokenizer --- *
 * Feed generated ids one at a time; receives only complete UTF-8 characters.
 * An incomplete multi-byte sequence at the end of a piece is held back until
 * the next piece completes it (or kv_detok_flush). Bytes that can never form
 * a valid character are passed through as they are, so the output bytes are
 * always exactly the concatenated pieces. Plain data: copy or reset freely. */
typedef struct kv_detok {
    unsigned char pending[8]; /* held-back start of an incomplete UTF-8 sequence (<= 3 bytes) */
    int n_pending;            /* bytes in pending */
    int after_bos;            /* 1: the next non-empty piece drops one leading space */
    int strip_bos_space;      /* the tokenizer adds an SPM dummy prefix, so the rule applies */
    int include_special;      /* render control tokens as their text */
} kv_detok;

/* The SPM display rule (llama2.c, llama.cpp): the first piece after BOS
 * drops the leading space the dummy prefix put there, for tokenizers that
 * add one (kv_tokenizer_add_space_prefix). Pushing BOS arms it; the flag
 * KV_DETOK_AT_BOS arms it from the start, for a stream whose BOS was not
 * pushed (e.g. it starts with the first prompt token). Leave it off when the
 * stream continues text already shown (generated tokens after an echoed
 * prompt), or a first piece " upon" would lose its space. */
enum {
    KV_DETOK_AT_BOS = 1, /* the stream starts right after a BOS */
    KV_DETOK_SPECIAL = 2 /* control tokens decode to their text */
};

void kv_detok_init(kv_detok *d /* OUT: */, const kv_tokenizer *t, int flags);
/* Appends token id's piece. Writes the complete UTF-8 bytes now available to
 * out and returns their count, or KV_ERR_RANGE for a bad id or when cap is
 * below kv_tokenizer_max_piece(t) + 8 (the state is then unchanged). */
int kv_detok_push(const kv_tokenizer *t, kv_detok *d, int32_t id, char *out /* OUT: (cap) */, size_t cap);
/* Emits whatever is held back (an unfinished sequence at the end of a
 * stream) and resets the pending state; returns the byte count (cap >= 8). */
int kv_detok_flush(const kv_tokenizer *t, kv_detok *d, char *out /* OUT: (cap) */, size_t cap);

#endif
