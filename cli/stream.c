/* stream.c - runs one request on a caller-stepped engine and streams its
 * text; see stream.h. */
#include "stream.h"

#include <stdlib.h>
#include <string.h>

enum {
    EVENTS = 64,      /* events taken per poll */
    IDLE_STEPS = 1000 /* steps in a row with nothing to do: the request can never run */
};

void cli_size_for_context(kv_config *cfg, int ctx) {
    if (ctx <= 0) ctx = CLI_DEFAULT_CTX;
    if (ctx > 1048576) ctx = 1048576; /* scheduler.max_seq_len's range */
    cfg->scheduler.max_seq_len = ctx;
    int bs = cfg->kv.block_size > 0 ? cfg->kv.block_size : 16;
    int base = (ctx + bs - 1) / bs;
    /* one block for the next token and the scheduler's 1% watermark on top */
    cfg->kv.blocks = base + base / 99 + 2;
    /* no workload runs here: one that could not fit max_seq_len would fail
     * kv_config_validate for nothing */
    cfg->workload.requests = 0;
    cfg->workload.system_prompt_len = 0;
    cfg->workload.prompt_len = (kv_dist){.kind = KV_DIST_FIXED, .value = 1, .min = 1, .max = 1, .mean = 1};
    cfg->workload.output_len = cfg->workload.prompt_len;
}

int cli_context(const kv_engine *e) {
    const kv_config *c = kv_engine_config(e);
    int ctx = kv_engine_model(e)->hp.ctx_len;
    return c->scheduler.max_seq_len > 0 ? KV_MIN(c->scheduler.max_seq_len, ctx) : ctx;
}

void cli_engine_notes(const char *cmd, const kv_engine *e, int asked_ctx, FILE *f) {
    const kv_model *m = kv_engine_model(e);
    const char *w = kv_tokenizer_warning(m->tok);
    if (w && *w) fprintf(f, "kvtop %s: note: %s\n", cmd, w);
    if (kv_model_warning(m)[0]) fprintf(f, "kvtop %s: warning: %s\n", cmd, kv_model_warning(m));
    if (asked_ctx > m->hp.ctx_len)
        fprintf(f, "kvtop %s: note: --ctx %d is more than the model's context; using its %d tokens\n", cmd, asked_ctx,
                m->hp.ctx_len);
}

/* The ids of n tokens at most are malloc'ed once: out of memory, or the
 * prompt too long (KV_ERR_RANGE) or empty, says so in err. */
static int take_ids(int k, int32_t *v, int max_tokens, int32_t **ids, int *n, kv_err *err) {
    if (k == KV_ERR_RANGE)
        k = kv_err_set(err, k, "the prompt is longer than the context (more than %d tokens)", max_tokens);
    else if (k == 0)
        k = kv_err_set(err, KV_ERR_INVAL, "the prompt encodes to no tokens");
    if (k <= 0) {
        free(v);
        return k;
    }
    *ids = v;
    *n = k;
    return 0;
}

int cli_encode(const kv_tokenizer *tok, const char *text, int add_bos, int parse_special, int max_tokens,
               int32_t **ids, int *n, kv_err *err) {
    *ids = NULL;
    *n = 0;
    if (max_tokens <= 0) return kv_err_set(err, KV_ERR_INVAL, "no room for a prompt (max_tokens %d)", max_tokens);
    int32_t *v = malloc((size_t)max_tokens * sizeof *v);
    if (!v) return kv_err_set(err, KV_ERR_NOMEM, "out of memory for %d prompt tokens", max_tokens);
    kv_encode_opts o = {.add_bos = add_bos && kv_tokenizer_add_bos(tok) && kv_tokenizer_bos(tok) >= 0,
                        .parse_special = parse_special,
                        .max_tokens = max_tokens};
    int k = kv_tokenizer_encode_ex(tok, text, strlen(text), &o, v, max_tokens, err);
    return take_ids(k, v, max_tokens, ids, n, err);
}

int cli_encode_chat(const kv_model *m, const kv_chat_msg *msgs, int n_msgs, int add_bos, int parse_special,
                    int max_tokens, int32_t **ids, int *n, kv_err *err) {
    *ids = NULL;
    *n = 0;
    if (max_tokens <= 0) return kv_err_set(err, KV_ERR_INVAL, "no room for a prompt (max_tokens %d)", max_tokens);
    int32_t *v = malloc((size_t)max_tokens * sizeof *v);
    if (!v) return kv_err_set(err, KV_ERR_NOMEM, "out of memory for %d prompt tokens", max_tokens);
    kv_chat_tok_params p;
    kv_chat_tok_defaults(&p);
    p.add_bos = add_bos;
    p.parse_special = parse_special;
    p.max_tokens = max_tokens;
    int k = kv_chat_tokenize(kv_chat_detect(m->chat_template), m->chat_template, m->tok, msgs, n_msgs, &p, v,
                             max_tokens, err);
    return take_ids(k, v, max_tokens, ids, n, err);
}

/* Appends n bytes to the reply buffer. */
static int reply_add(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        while (nc < *len + n + 1) nc *= 2;
        char *p = realloc(*buf, nc);
        if (!p) return KV_ERR_NOMEM;
        *buf = p;
        *cap = nc;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

int cli_stream_run(kv_engine *e, const kv_request_params *p, FILE *out, int want_text, cli_stream_result *r,
                   kv_err *err) {
    memset(r, 0, sizeof *r);
    char *text = NULL;
    size_t len = 0, cap = 0;
    if (want_text && reply_add(&text, &len, &cap, "", 0)) return kv_err_set(err, KV_ERR_NOMEM, "out of memory");
    double t_submit = kv_engine_now_ms(e), t_first = -1, t_last = -1, prefill_s = 0;
    int64_t id = kv_engine_submit(e, p, err);
    if (id < 0) {
        free(text);
        return (int)id;
    }
    kv_event ev[EVENTS];
    int done = 0, idle = 0, rc = 0;
    while (!done) {
        double s0 = kv_now_s();
        int st = kv_engine_step(e);
        if (st < 0) {
            rc = kv_err_set(err, st, "engine step failed (%d)", st);
            goto fail;
        }
        if (t_first < 0) prefill_s += kv_now_s() - s0;
        idle = st == 0 ? idle + 1 : 0;
        int n;
        while (!done && (n = kv_engine_poll(e, ev, EVENTS)) > 0) {
            for (int i = 0; i < n; i++) {
                if (ev[i].req != id) continue;
                if (ev[i].type == KV_EVENT_TOKEN && ev[i].token >= 0) { /* token -1 carries overflow text */
                    r->n_tokens++;
                    if (t_first < 0) t_first = ev[i].t_ms;
                    t_last = ev[i].t_ms;
                }
                if (ev[i].text_len > 0) {
                    if (out) {
                        fwrite(ev[i].text, 1, (size_t)ev[i].text_len, out);
                        fflush(out);
                    }
                    if (want_text && reply_add(&text, &len, &cap, ev[i].text, (size_t)ev[i].text_len)) {
                        rc = kv_err_set(err, KV_ERR_NOMEM, "out of memory");
                        goto fail;
                    }
                }
                if (ev[i].type == KV_EVENT_DONE) {
                    done = 1;
                    r->finish = ev[i].finish;
                    snprintf(r->reason, sizeof r->reason, "%s", ev[i].reason);
                }
            }
        }
        if (!done && idle >= IDLE_STEPS) {
            rc = kv_err_set(err, KV_ERR_BACKEND, "the engine cannot schedule the request");
            goto fail;
        }
    }
    kv_engine_forget(e, id);
    if (r->finish == KV_FINISH_ERROR || r->finish == KV_FINISH_REJECTED || r->finish == KV_FINISH_CANCELLED) {
        rc = kv_err_set(err, r->finish == KV_FINISH_ERROR ? KV_ERR_BACKEND : KV_ERR_INVAL, "%s",
                        r->reason[0] ? r->reason : "the request failed");
        goto fail;
    }
    r->prefill_s = prefill_s;
    r->ttft_s = t_first >= 0 ? (t_first - t_submit) / 1000.0 : 0;
    r->decode_s = t_first >= 0 ? (t_last - t_first) / 1000.0 : 0;
    r->text = text;
    return 0;
fail:
    free(text);
    return rc;
}
