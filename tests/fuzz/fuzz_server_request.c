/* fuzz_server_request.c - libFuzzer target for the server's request
 * parser (server/request.c): chat and completions bodies, /tokenize,
 * /detokenize and /kvtop/v1/control. Oracles: no crash or leak; a parse
 * either succeeds with its invariants (counts within the documented
 * bounds, sampling values inside the key table's ranges, no NUL inside
 * any text) or fails with a 4xx/5xx status and a message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../server/request.h"

static void check_error(int rc, const srv_error *e) {
    if (rc == 0) return;
    if (e->status < 400 || e->status > 599 || !e->message[0]) abort();
}

static void check_gen(const srv_gen_req *r) {
    if (r->n < 1 || r->n > SRV_MAX_N || r->n_stop > SRV_MAX_STOP) abort();
    if (r->max_tokens != -1 && (r->max_tokens < 1 || r->max_tokens > SRV_MAX_TOKENS_CAP)) abort();
    if (!(r->sampling.temperature >= 0 && r->sampling.temperature <= 100)) abort();
    if (!(r->sampling.top_p > 0 && r->sampling.top_p <= 1)) abort();
    if (!(r->sampling.min_p >= 0 && r->sampling.min_p < 1)) abort();
    for (int i = 0; i < r->n_stop; i++) {
        size_t l = strlen(r->stop[i]);
        if (l == 0 || l > SRV_MAX_STOP_LEN) abort();
    }
    for (int i = 0; i < r->n_msgs; i++)
        if (strlen(r->msgs[i].content) != r->msgs[i].len) abort(); /* no NUL inside */
    if (r->kind == SRV_CHAT ? r->n_msgs < 1 : r->n_prompts < 1) abort();
    if ((r->kind == SRV_COMPLETION ? r->n_prompts : 1) * r->n > SRV_MAX_CHOICES) abort();
    for (int i = 0; i < r->n_prompts; i++) {
        const srv_prompt *p = &r->prompts[i];
        if (!p->text == !p->ids) abort();
        if (p->text && strlen(p->text) != p->len) abort();
        for (int k = 0; k < p->n_ids; k++)
            if (p->ids[k] < 0) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *body = (const char *)data;
    kv_config c;
    kv_config_default(&c);
    srv_error e;
    for (int kind = 0; kind < 2; kind++) {
        srv_gen_req r;
        int rc = srv_parse_gen(body, size, (srv_kind)kind, &c.sampling, &r, &e);
        check_error(rc, &e);
        if (rc == 0) {
            check_gen(&r);
            srv_gen_req_free(&r);
        }
    }
    srv_tok_req t;
    int rc = srv_parse_tokenize(body, size, &t, &e);
    check_error(rc, &e);
    if (rc == 0) {
        if (!t.prompt == !t.msgs) abort();
        srv_tok_req_free(&t);
    }
    srv_detok_req d;
    rc = srv_parse_detokenize(body, size, &d, &e);
    check_error(rc, &e);
    if (rc == 0) srv_detok_req_free(&d);
    srv_ctl_req q;
    rc = srv_parse_control(body, size, &q, &e);
    check_error(rc, &e);
    if (rc == 0 && q.action == SRV_CTL_SLOW && (q.delay_ms < 0 || q.delay_ms > 60000)) abort();
    return 0;
}
