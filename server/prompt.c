/* prompt.c - chat rendering and encoding with message text kept plain.
 *
 * NOTE: the tokenizer takes one parse_special flag per call, so the text is
 * encoded in pieces: wherever a message holds a special token's text, that
 * occurrence is replaced (before rendering) by a marker of 0xFF bytes,
 * which no UTF-8 text (and so no JSON string) contains, and after
 * rendering the marked occurrences are encoded as plain text between the
 * pieces encoded with specials on. Special tokens split the encoding into
 * fragments anyway, so for every other byte the ids are the whole-text
 * encoding's; messages without special-token text take the whole-text
 * path, identical to the TUI's and `generate --chat`'s. */
#include "prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/chat_template.h"
#include "../engine/tokenizer.h"

#define MARK 0xFF /* opens and closes a marker: "\xff<index>\xff" */

/* A growable id array. */
typedef struct id_vec {
    int32_t *v;
    int n, cap;
} id_vec;

static int encode_append(const kv_tokenizer *t, id_vec *out, const char *s, size_t len, int add_bos, int special,
                         kv_err *err) {
    int n = kv_tokenizer_encode(t, s, len, add_bos, special, NULL, 0, err);
    if (n < 0) return n;
    if (out->n + n > out->cap) {
        int cap = out->n + n + 64;
        int32_t *v = realloc(out->v, (size_t)cap * sizeof *v);
        if (!v) return kv_err_set(err, KV_ERR_NOMEM, "out of memory for %d prompt tokens", out->n + n);
        out->v = v;
        out->cap = cap;
    }
    if (n > 0) kv_tokenizer_encode(t, s, len, add_bos, special, out->v + out->n, n, err);
    out->n += n;
    return 0;
}

int srv_prompt_text(const kv_model *m, const char *text, size_t len, int add_bos, int parse_special, int32_t **ids,
                    int *n, kv_err *err) {
    const kv_tokenizer *t = m->tok;
    id_vec v = {0};
    int bos = add_bos && kv_tokenizer_add_bos(t) && kv_tokenizer_bos(t) >= 0;
    int rc = encode_append(t, &v, text, len, bos, parse_special, err);
    if (rc) {
        free(v.v);
        return rc;
    }
    *ids = v.v;
    *n = v.n;
    return 0;
}

/* The special-token occurrences in s: their offsets and lengths, from the
 * tokenizer's own split (a special token is one piece; with parse_special
 * off the same text splits otherwise). Returns the count (0: none), or
 * a negative KV_ERR_*. *offs / *lens are malloc'd when the count > 0. */
static int find_specials(const kv_tokenizer *t, const char *s, size_t len, size_t **offs, size_t **lens,
                         kv_err *err) {
    *offs = *lens = NULL;
    if (len == 0) return 0;
    int np = kv_tokenizer_split(t, s, len, 1, NULL, 0, err);
    if (np <= 0) return np;
    int32_t *pl = malloc((size_t)np * sizeof *pl);
    if (!pl) return kv_err_set(err, KV_ERR_NOMEM, "out of memory splitting a message");
    kv_tokenizer_split(t, s, len, 1, pl, np, err);
    int found = 0;
    size_t at = 0;
    for (int pass = 0; pass < 2; pass++) {
        at = 0;
        for (int i = 0; i < np; i++) {
            size_t l = (size_t)pl[i];
            int32_t id = -1;
            if (l > 0 && l < 256) {
                char piece[256];
                memcpy(piece, s + at, l);
                piece[l] = 0;
                id = kv_tokenizer_find(t, piece);
            }
            int ty = id >= 0 ? kv_tokenizer_token_type(t, id) : 0;
            /* user-defined tokens match either way: only control/unknown ones are forged */
            if (ty == KV_TOKEN_CONTROL || ty == KV_TOKEN_UNKNOWN) {
                if (pass == 1) {
                    (*offs)[found] = at;
                    (*lens)[found] = l;
                }
                found++;
            }
            at += l;
        }
        if (pass == 0) {
            if (found == 0) break;
            *offs = malloc((size_t)found * sizeof **offs);
            *lens = malloc((size_t)found * sizeof **lens);
            if (!*offs || !*lens) {
                free(*offs);
                free(*lens);
                *offs = *lens = NULL;
                free(pl);
                return kv_err_set(err, KV_ERR_NOMEM, "out of memory splitting a message");
            }
            found = 0;
        }
    }
    free(pl);
    return found;
}

/* One forged occurrence: its text (borrowed from the message). */
typedef struct forged {
    const char *s;
    size_t len;
} forged;

/* Copies message text s into a new string with each special occurrence
 * replaced by a marker numbered from *next (appending to *fv). */
static char *mark_message(const char *s, size_t len, const size_t *offs, const size_t *lens, int k, forged **fv,
                          int *nf, int *capf) {
    size_t out_len = len + (size_t)k * 16 + 1;
    char *o = malloc(out_len);
    if (!o) return NULL;
    size_t w = 0, at = 0;
    for (int i = 0; i < k; i++) {
        memcpy(o + w, s + at, offs[i] - at);
        w += offs[i] - at;
        if (*nf == *capf) {
            int cap = *capf ? *capf * 2 : 16;
            forged *nv = realloc(*fv, (size_t)cap * sizeof *nv);
            if (!nv) {
                free(o);
                return NULL;
            }
            *fv = nv;
            *capf = cap;
        }
        (*fv)[*nf] = (forged){s + offs[i], lens[i]};
        w += (size_t)snprintf(o + w, 16, "%c%d%c", MARK, *nf, MARK);
        (*nf)++;
        at = offs[i] + lens[i];
    }
    memcpy(o + w, s + at, len - at);
    w += len - at;
    o[w] = 0;
    return o;
}

/* Encodes rendered text: pieces between markers with specials on, each
 * marker as its forged text with specials off. */
static int encode_marked(const kv_tokenizer *t, const char *text, size_t len, int bos, const forged *fv, int nf,
                         id_vec *out, kv_err *err) {
    size_t at = 0, piece = 0;
    int first = 1;
    while (at < len) {
        if ((unsigned char)text[at] != MARK) {
            at++;
            continue;
        }
        char *end = NULL;
        long idx = strtol(text + at + 1, &end, 10);
        if (!end || (unsigned char)*end != MARK || idx < 0 || idx >= nf)
            return kv_err_set(err, KV_ERR_INVAL, "prompt: a marker was cut by the chat template");
        int rc = at > piece ? encode_append(t, out, text + piece, at - piece, first && bos, 1, err) : 0;
        if (rc) return rc;
        if (at > piece) first = 0;
        if ((rc = encode_append(t, out, fv[idx].s, fv[idx].len, first && bos, 0, err))) return rc;
        first = 0;
        at = (size_t)(end - text) + 1;
        piece = at;
    }
    if (len > piece || first) return encode_append(t, out, text + piece, len - piece, first && bos, 1, err);
    return 0;
}

static int render(const kv_model *m, const kv_chat_msg *cm, int n, int gen, char **out, kv_err *err) {
    kv_chat_tmpl tm = kv_chat_detect(m->chat_template);
    int need = kv_chat_format_ex(tm, m->chat_template, 0, cm, n, gen, NULL, 0);
    if (need < 0) return kv_err_set(err, KV_ERR_INVAL, "cannot format the chat template (%s)", kv_err_str(need));
    *out = malloc((size_t)need + 1);
    if (!*out) return kv_err_set(err, KV_ERR_NOMEM, "out of memory formatting the chat template");
    kv_chat_format_ex(tm, m->chat_template, 0, cm, n, gen, *out, (size_t)need + 1);
    return need;
}

int srv_prompt_chat(const kv_model *m, const srv_msg *msgs, int n_msgs, int add_generation_prompt, int parse_special,
                    int32_t **ids, int *n, kv_err *err) {
    kv_err local;
    if (!err) err = &local;
    const kv_tokenizer *t = m->tok;
    int bos = kv_tokenizer_add_bos(t) && kv_tokenizer_bos(t) >= 0;
    kv_chat_msg *cm = calloc((size_t)(n_msgs > 0 ? n_msgs : 1), sizeof *cm);
    char **marked = calloc((size_t)(n_msgs > 0 ? n_msgs : 1), sizeof *marked);
    forged *fv = NULL;
    int nf = 0, capf = 0, rc = 0;
    char *text = NULL;
    id_vec v = {0};
    if (!cm || !marked) {
        rc = kv_err_set(err, KV_ERR_NOMEM, "out of memory for %d messages", n_msgs);
        goto done;
    }
    for (int i = 0; i < n_msgs; i++) {
        cm[i] = (kv_chat_msg){.role = msgs[i].role, .content = msgs[i].content};
        if (parse_special) continue;
        size_t *offs, *lens;
        int k = find_specials(t, msgs[i].content, msgs[i].len, &offs, &lens, err);
        if (k < 0) {
            rc = k;
            goto done;
        }
        if (k == 0) continue;
        marked[i] = mark_message(msgs[i].content, msgs[i].len, offs, lens, k, &fv, &nf, &capf);
        free(offs);
        free(lens);
        if (!marked[i]) {
            rc = kv_err_set(err, KV_ERR_NOMEM, "out of memory marking message %d", i);
            goto done;
        }
        cm[i].content = marked[i];
    }
    int len = render(m, cm, n_msgs, add_generation_prompt, &text, err);
    if (len < 0) {
        rc = len;
        goto done;
    }
    if (nf == 0) rc = encode_append(t, &v, text, (size_t)len, bos, 1, err);
    else rc = encode_marked(t, text, (size_t)len, bos, fv, nf, &v, err);
done:
    for (int i = 0; marked && i < n_msgs; i++) free(marked[i]);
    free(marked);
    free(cm);
    free(fv);
    free(text);
    if (rc) {
        free(v.v);
        return rc;
    }
    *ids = v.v;
    *n = v.n;
    return 0;
}

const char *srv_prompt_end_of_turn(const kv_model *m) {
    kv_chat_tmpl tm = kv_chat_detect(m->chat_template);
    if (tm == KV_CHAT_PLAIN) return NULL;
    const char *eot = kv_chat_end_of_turn(tm);
    if (!eot || !*eot) return NULL;
    int32_t id = kv_tokenizer_find(m->tok, eot);
    if (id >= 0 && kv_tokenizer_is_eog(m->tok, id)) return NULL;
    return eot;
}
