/* logprobs_json.c - a choice's "logprobs" object in the two shapes OpenAI
 * clients read: chat's {"content": [{token, logprob, bytes, top_logprobs}]}
 * and the legacy completions' {tokens, token_logprobs, top_logprobs,
 * text_offset}. The values are the engine's (raw model log-softmax, see
 * kv_event.logprob); this file only names the tokens. */
#include <stdlib.h>
#include <string.h>

#include "../base/utf8.h"
#include "../engine/tokenizer.h"
#include "srv.h"

/* Characters (code points; an invalid byte counts as one U+FFFD, as the
 * JSON writer prints it) in s[0..n). */
static size_t n_chars(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; k++) {
        uint32_t cp;
        i += kv_utf8_decode((const unsigned char *)s + i, n - i, &cp);
    }
    return k;
}

/* Token id's text into buf (cap >= 24; cut to cap - 1, NUL-terminated):
 * control tokens by their text, so an alternative "<|im_end|>" shows as
 * such; or "token_id:N" when as_ids. Returns its length. */
static size_t piece_of(const kv_tokenizer *tok, int as_ids, int32_t id, char *buf, size_t cap) {
    if (as_ids) return (size_t)snprintf(buf, cap, "token_id:%d", (int)id);
    int n = kv_tokenizer_piece(tok, id, 1, buf, cap - 1);
    size_t len = n < 0 ? 0 : KV_MIN((size_t)n, cap - 1);
    buf[len] = 0;
    return len;
}

/* What names tokens: the tokenizer, the id form, a buffer. */
typedef struct namer {
    const kv_tokenizer *tok;
    int as_ids;
    char *buf;
    size_t cap;
} namer;
static size_t piece(const namer *nm, int32_t id) { return piece_of(nm->tok, nm->as_ids, id, nm->buf, nm->cap); }

/* {"token", "logprob", "bytes"} of one token (chat). */
static void chat_token(kv_json_writer *w, const char *t, size_t len, float lp) {
    kv_json_write_key(w, "token");
    kv_json_write_string_n(w, t, len);
    kv_json_field_num(w, "logprob", lp);
    kv_json_write_key(w, "bytes");
    kv_json_write_begin_array(w);
    for (size_t i = 0; i < len; i++) kv_json_write_int(w, (unsigned char)t[i]);
    kv_json_write_end_array(w);
}

static void write_chat(kv_json_writer *w, const namer *nm, const srv_logprob *lp, int n) {
    const char *buf = nm->buf;
    kv_json_write_key(w, "content");
    kv_json_write_begin_array(w);
    for (int i = 0; i < n; i++) {
        kv_json_write_begin_object(w);
        size_t len = piece(nm, lp[i].token);
        chat_token(w, buf, len, lp[i].logprob);
        kv_json_write_key(w, "top_logprobs");
        kv_json_write_begin_array(w);
        for (int k = 0; k < lp[i].n_top; k++) {
            kv_json_write_begin_object(w);
            len = piece(nm, lp[i].top_token[k]);
            chat_token(w, buf, len, lp[i].top_logprob[k]);
            kv_json_write_end_object(w);
        }
        kv_json_write_end_array(w);
        kv_json_write_end_object(w);
    }
    kv_json_write_end_array(w);
}

/* NOTE: as vLLM does, a completions top_logprobs entry holds the top N and
 * also the chosen token when it is not among them (a sampled one), so
 * `logprobs: 0` still names the chosen token there. */
static void write_completion(kv_json_writer *w, const namer *nm, const srv_logprob *lp, int n, size_t *offset) {
    const char *buf = nm->buf;
    kv_json_write_key(w, "tokens");
    kv_json_write_begin_array(w);
    for (int i = 0; i < n; i++) kv_json_write_string_n(w, buf, piece(nm, lp[i].token));
    kv_json_write_end_array(w);
    kv_json_write_key(w, "token_logprobs");
    kv_json_write_begin_array(w);
    for (int i = 0; i < n; i++) kv_json_write_number(w, lp[i].logprob);
    kv_json_write_end_array(w);
    kv_json_write_key(w, "top_logprobs");
    kv_json_write_begin_array(w);
    for (int i = 0; i < n; i++) {
        kv_json_write_begin_object(w);
        int chosen_in = 0;
        for (int k = 0; k < lp[i].n_top; k++) {
            chosen_in |= lp[i].top_token[k] == lp[i].token;
            piece(nm, lp[i].top_token[k]);
            kv_json_field_num(w, buf, lp[i].top_logprob[k]);
        }
        if (!chosen_in) {
            piece(nm, lp[i].token);
            kv_json_field_num(w, buf, lp[i].logprob);
        }
        kv_json_write_end_object(w);
    }
    kv_json_write_end_array(w);
    kv_json_write_key(w, "text_offset");
    kv_json_write_begin_array(w);
    for (int i = 0; i < n; i++) {
        kv_json_write_uint(w, *offset);
        *offset += n_chars(buf, piece(nm, lp[i].token));
    }
    kv_json_write_end_array(w);
}

int srv_write_logprobs(kv_json_writer *w, const kv_tokenizer *tok, srv_kind kind, int as_ids, const srv_logprob *lp,
                       int n, size_t *offset) {
    size_t cap = (size_t)KV_MAX(kv_tokenizer_max_piece(tok), 24) + 1;
    char *buf = malloc(cap);
    if (!buf) return KV_ERR_NOMEM;
    kv_json_write_begin_object(w);
    namer nm = {tok, as_ids, buf, cap};
    if (kind == SRV_CHAT) write_chat(w, &nm, lp, n);
    else write_completion(w, &nm, lp, n, offset);
    kv_json_write_end_object(w);
    free(buf);
    return 0;
}
