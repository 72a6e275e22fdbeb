/* tokenizer_internal.h - what the tokenizer's files share and nothing
 * else includes: the tokenizer struct, the byte-level table, the hashes
 * of its indexes, the id emitter. The tokenizer is
 *   tokenizer.c       encoding (SentencePiece, byte-level and raw BPE),
 *                     special tokens, decoding and the streaming detokenizer
 *   tokenizer_wpm.c   WordPiece (BERT) encoding
 *   tokenizer_load.c  building one: from GGUF metadata or a llama2.c
 *                     tokenizer.bin, and the indexes every lookup uses
 *   pretokenize.c     BPE's pre-tokenizers */
#ifndef KV_TOKENIZER_INTERNAL_H
#define KV_TOKENIZER_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "../base/hash.h"
#include "pretokenize.h"
#include "tokenizer.h"

#define KV_TOK_MAX_VOCAB (1 << 24)
#define SPM_SPACE "\xE2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's space */

/* Byte-level tables, part of each tokenizer so nothing global is built
 * lazily. */
typedef struct bytelevel_tab {
    char utf8[256][2];  /* UTF-8 of byte b's character (1 or 2 bytes) */
    uint8_t n[256];     /* its length */
    int16_t back[324];  /* code point -> byte, for cp < 324; -1 = none */
} bytelevel_tab;

struct kv_tokenizer {
    kv_tok_type type;
    int n_vocab;
    char *pool;         /* every token text, NUL-terminated, back to back */
    uint32_t *off;      /* (n_vocab) offset of token i's text in pool */
    uint32_t *len;      /* (n_vocab) bytes of token i's text */
    float *scores;      /* (n_vocab) SPM merge priority; zeros for BPE */
    uint8_t *ttype;     /* (n_vocab) KV_TOKEN_* */
    uint8_t *eog;       /* (n_vocab) 1 = ends generation */
    uint8_t *byteval;   /* (n_vocab) the byte an SPM <0xNN> token stands for */
    int max_len;        /* longest token text, bytes */

    int32_t *hash;      /* (hash_mask + 1) token ids by text, -1 = empty; open addressing */
    uint32_t hash_mask;

    /* BPE merges, keyed by (left id << 32 | right id). */
    uint64_t *mkey;     /* (merge_mask + 1) key, UINT64_MAX = empty */
    int32_t *mrank;     /* (merge_mask + 1) position in tokenizer.ggml.merges: lower merges first */
    int32_t *mid;       /* (merge_mask + 1) id of the merged token */
    uint32_t merge_mask;
    int n_merges;

    /* SPM: token used when byte b has to go through byte fallback.
     * BPE: token of byte b's byte-level character. -1 when the vocab has none. */
    int32_t byte_tok[256];

    /* Texts matched before BPE/SPM (control, user-defined, unknown types),
     * grouped by first byte, longest first within a group. */
    int32_t *spec;       /* (n_spec) token ids */
    int n_spec;
    uint32_t spec_start[257]; /* spec[spec_start[b] .. spec_start[b+1]) start with byte b */

    bytelevel_tab bl;    /* byte-level character map (used by BPE) */

    int32_t bos, eos, unk, eot, eom;
    int add_bos;
    int add_space_prefix;
    int no_drop;         /* every byte encodes to at least one token (byte tokens or <unk>), so each id
                            covers at most max_len bytes of text: the bound bounded encoding relies on */
    int ignore_merges;   /* Llama 3: a word that is itself a token skips the merges */
    int wpm_lower;       /* WordPiece: lowercase (tokenizer.ggml.normalizer.lowercase, default 1) */
    int wpm_strip;       /* WordPiece: strip accents (tokenizer.ggml.normalizer.strip_accents, default as lower) */
    int raw_bpe;         /* BPE over raw UTF-8 with spaces spelled "▁" and <0xNN> byte fallback (GGUF model
                            "gemma4"), not over GPT-2's byte-level characters */
    kv_pre_kind pre;
    char pre_name[64];
    char model_name[32];
    char kind[128];      /* kv_tokenizer_kind's text */
    char *chat_template; /* NULL when none */
    char warning[192];   /* what the loader had to guess ("" when nothing): kv_tokenizer_warning */
};

/* ---- hashing (the vocab and merge indexes) ---- */

/* A token text's slot hash: FNV-1a with its high bits folded down (the
 * index masks the low ones). */
static inline uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = kv_hash_fnv1a(s, n);
    return h ^ (h >> 29);
}

static inline uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static inline const char *tok_text(const kv_tokenizer *t, int32_t id) { return t->pool + t->off[id]; }

/* Writes s[0..n) to dst with every space spelled as SentencePiece's
 * SPM_SPACE; dst has room for 3 * n bytes. Returns the bytes written. */
static inline size_t tok_spm_escape(char *dst /* OUT: (3 * n) */, const char *s, size_t n) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(dst + m, SPM_SPACE, 3);
            m += 3;
        } else {
            dst[m++] = s[i];
        }
    }
    return m;
}

/* The id of the token whose text is s[0..n), or -1 (tokenizer.c). */
int32_t tok_find_text(const kv_tokenizer *t, const char *s, size_t n);

/* ---- where encoding writes its ids ---- */

typedef struct emitter {
    int32_t *out;
    int64_t cap;
    int64_t n;   /* ids produced so far (may exceed cap) */
    int64_t max; /* > 0: the most ids wanted (kv_encode_opts.max_tokens); 0: no limit */
    int over;    /* bool: n is known to pass max: encoding stops */
} emitter;

static inline void emit(emitter *e, int32_t id) {
    if (e->n < e->cap) e->out[e->n] = id;
    e->n++;
}

/* Whether e has passed its limit (and then sets e->over). */
static inline int passed(emitter *e) {
    if (e->max > 0 && e->n > e->max) e->over = 1;
    return e->over;
}

/* WordPiece (tokenizer_wpm.c): encodes the n bytes at s (text between
 * special tokens) into e, stopping once e passes its limit. 0, or
 * KV_ERR_NOMEM. */
int wpm_encode(const kv_tokenizer *t, const char *s, size_t n, emitter *e);

#endif
