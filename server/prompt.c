/* prompt.c - request text to prompt ids through the engine's one rule
 * (kv_chat_tokenize, kv_tokenizer_encode_ex): the same ids the TUI, `kvtop
 * chat` and `generate --chat` send for the same conversation, with the
 * work bounded by the context. */
#include "prompt.h"

#include <stdlib.h>
#include <string.h>

#include "../engine/chat_template.h"
#include "../engine/tokenizer.h"

/* ids for up to max_tokens (+1 so "over" is seen), or all when 0. */
static int32_t *alloc_ids(int max_tokens, int n, kv_err *err) {
    int cap = max_tokens > 0 ? max_tokens : n;
    int32_t *ids = malloc((size_t)(cap > 0 ? cap : 1) * sizeof *ids);
    if (!ids) kv_err_set(err, KV_ERR_NOMEM, "out of memory for %d prompt tokens", cap);
    return ids;
}

int srv_prompt_text(const kv_model *m, const char *text, size_t len, int add_bos, int parse_special, int max_tokens,
                    int32_t **ids, int *n, kv_err *err) {
    const kv_tokenizer *t = m->tok;
    kv_encode_opts o = {
        .add_bos = add_bos && kv_tokenizer_add_bos(t) && kv_tokenizer_bos(t) >= 0,
        .parse_special = parse_special,
        .max_tokens = max_tokens,
    };
    int need = max_tokens > 0 ? max_tokens : kv_tokenizer_encode_ex(t, text, len, &o, NULL, 0, err);
    if (need < 0) return need;
    int32_t *v = alloc_ids(max_tokens, need, err);
    if (!v) return KV_ERR_NOMEM;
    int got = kv_tokenizer_encode_ex(t, text, len, &o, v, max_tokens > 0 ? max_tokens : need, err);
    if (got < 0) {
        free(v);
        return got;
    }
    *ids = v;
    *n = got;
    return 0;
}

int srv_prompt_chat(const kv_model *m, const srv_msg *msgs, int n_msgs, int add_generation_prompt, int parse_special,
                    int max_tokens, int32_t **ids, int *n, kv_err *err) {
    kv_chat_msg *cm = calloc((size_t)(n_msgs > 0 ? n_msgs : 1), sizeof *cm);
    if (!cm) return kv_err_set(err, KV_ERR_NOMEM, "out of memory for %d messages", n_msgs);
    for (int i = 0; i < n_msgs; i++) cm[i] = (kv_chat_msg){.role = msgs[i].role, .content = msgs[i].content};
    kv_chat_tmpl tm = kv_chat_detect(m->chat_template);
    kv_chat_tok_params p;
    kv_chat_tok_defaults(&p); /* no default system message, BOS as the tokenizer says */
    p.add_generation_prompt = add_generation_prompt;
    p.parse_special = parse_special;
    p.max_tokens = max_tokens;
    int rc, need = max_tokens > 0 ? max_tokens
                                  : kv_chat_tokenize(tm, m->chat_template, m->tok, cm, n_msgs, &p, NULL, 0, err);
    int32_t *v = need >= 0 ? alloc_ids(max_tokens, need, err) : NULL;
    if (need < 0) rc = need;
    else if (!v) rc = KV_ERR_NOMEM;
    else rc = kv_chat_tokenize(tm, m->chat_template, m->tok, cm, n_msgs, &p, v, max_tokens > 0 ? max_tokens : need, err);
    free(cm);
    if (rc < 0) {
        free(v);
        return rc;
    }
    *ids = v;
    *n = rc;
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
