/* test_source_metrics.c - attach's pure parts without a server: the metrics
 * adapters on the real llama-server scrape and /slots (16 of 16 busy) and on
 * the vLLM and SGLang fixtures (two scrapes ten seconds apart: rates and
 * percentiles from the deltas, worked out by hand), kind detection, the SSE
 * parser fed in every split, the chat-chunk reader, and the N/A reasons. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/trace.h"
#include "../harness.h"
#include "../../tui/http_client.h"
#include "../../tui/remote_chat.h"
#include "../../tui/source_metrics.h"

static int near(double a, double b) { return fabs(a - b) <= 1e-6 * (1 + fabs(b)); }

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 20);
    *len = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    if (buf) buf[*len] = 0;
    fclose(f);
    return buf;
}

static void test_llama_server(void) {
    size_t len, slen;
    char *t = slurp(harness_shared_path("fixtures/llama-server/metrics.txt"), &len);
    char *sl = slurp(harness_shared_path("fixtures/llama-server/slots.json"), &slen);
    REQUIRE(t && sl);
    CHECK(kv_metrics_detect_kind(t, len) == KV_SOURCE_LLAMACPP);
    kv_metrics_adapter *a = kv_metrics_adapter_new(KV_SOURCE_LLAMACPP, 60);
    REQUIRE(a);
    kv_remote_metrics m;
    CHECK(kv_metrics_adapter_feed(a, t, len, 100, &m, NULL, 0) == 0);
    CHECK((m.have & KV_RM_QUEUE) && m.running == 16 && m.waiting == 0);
    CHECK(!(m.have & KV_RM_KV_USAGE)); /* not exported: N/A */
    CHECK(!(m.have & (KV_RM_TTFT | KV_RM_ITL | KV_RM_E2E)));
    CHECK(!(m.have & KV_RM_TOKS)); /* one scrape: no rate yet */
    kv_source_slot slots[KV_SOURCE_MAX_SLOTS];
    kv_err err;
    int n = kv_metrics_parse_slots(sl, slen, slots, KV_SOURCE_MAX_SLOTS, &err);
    CHECKF(n == 16, "%d slots (%s)", n, err.msg);
    int busy = 0;
    for (int i = 0; i < n; i++) busy += slots[i].busy;
    CHECK(busy == 16 && slots[0].id == 0 && slots[0].task == 88 && slots[0].n_ctx == 1024);
    CHECK(slots[0].n_remaining == 64 && !slots[0].speculative);
    /* half a second later every slot decoded 10 more tokens, and slot 0 is on a new task with 3 */
    kv_source_slot later[KV_SOURCE_MAX_SLOTS];
    memcpy(later, slots, sizeof later);
    for (int i = 0; i < n; i++) later[i].n_decoded += 10;
    later[0].task = 999;
    later[0].n_decoded = 3;
    CHECK(near(kv_metrics_slots_rate(slots, n, later, n, 0.5), (15 * 10 + 3) / 0.5));
    CHECK(kv_metrics_slots_rate(slots, n, later, n, 0) == 0);
    CHECK(kv_metrics_parse_slots("{}", 2, slots, 4, &err) == KV_ERR_FORMAT);
    CHECK(kv_metrics_parse_slots("[{\"id\":\"x\"}]", 12, slots, 4, &err) == KV_ERR_FORMAT);
    CHECK(kv_metrics_parse_slots("[1", 2, slots, 4, &err) == KV_ERR_FORMAT);
    kv_metrics_adapter_free(a);
    free(t);
    free(sl);
}

/* text with every number after `name` (first occurrence of each line that
 * starts with it) multiplied by f: a later scrape of the same server. */
static char *scaled(const char *text, const char *prefix, double f) {
    size_t n = strlen(text);
    char *o = malloc(n * 2 + 64);
    if (!o) return NULL;
    size_t k = 0;
    const char *p = text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t ll = nl ? (size_t)(nl - p) : strlen(p);
        const char *sp = memchr(p, ' ', ll);
        const char *brace = memchr(p, '}', ll);
        if (sp && brace && brace < p + ll) sp = brace + 1;
        if (p[0] != '#' && !strncmp(p, prefix, strlen(prefix)) && sp) {
            double v = strtod(sp, NULL);
            k += (size_t)sprintf(o + k, "%.*s %.17g\n", (int)(sp - p), p, v * f);
        } else {
            memcpy(o + k, p, ll);
            k += ll;
            o[k++] = '\n';
        }
        p += ll + (nl ? 1 : 0);
    }
    o[k] = 0;
    return o;
}

/* The adapter of `kind` after its first scrape: the fixture at path read,
 * detected as kind and fed at time 0 into *m (OUT), whose gauges are
 * checked against running, waiting and kv_usage. The fixture's text goes
 * to *text (OUT, the caller frees it) when text is not NULL, else it is
 * freed. NULL (after a failed CHECK) when it cannot be read, made or fed. */
static kv_metrics_adapter *first_scrape(const char *path, kv_source_kind kind, double running, double waiting,
                                        double kv_usage, char **text, kv_remote_metrics *m) {
    size_t len;
    char *t = slurp(path, &len);
    CHECKF(t, "cannot read %s", path);
    if (!t) return NULL;
    CHECK(kv_metrics_detect_kind(t, len) == kind);
    kv_metrics_adapter *a = kv_metrics_adapter_new(kind, 60);
    CHECK(a);
    if (a && kv_metrics_adapter_feed(a, t, len, 0, m, NULL, 0) != 0) {
        CHECKF(0, "%s: the first scrape is not read", path);
        kv_metrics_adapter_free(a);
        a = NULL;
    }
    if (a)
        CHECKF(m->running == running && m->waiting == waiting && near(m->kv_usage, kv_usage),
               "%s: running %g, waiting %g, kv usage %g", path, m->running, m->waiting, m->kv_usage);
    if (a && text)
        *text = t;
    else
        free(t);
    return a;
}

/* The scrape ten seconds after first_scrape's, every counter and bucket
 * (and gauge) of the fixture text t doubled, fed into a as *m; the doubled
 * text (the caller frees it), NULL after a failed CHECK. */
static char *doubled_scrape(kv_metrics_adapter *a, const char *t, const char *prefix, kv_remote_metrics *m) {
    char *t2 = scaled(t, prefix, 2.0);
    CHECKF(t2, "cannot scale %s", prefix);
    if (t2) CHECK(kv_metrics_adapter_feed(a, t2, strlen(t2), 10, m, NULL, 0) == 0);
    return t2;
}

/* Frees what a test of two scrapes holds. */
static void scrapes_free(kv_metrics_adapter *a, char *t, char *t2) {
    kv_metrics_adapter_free(a);
    free(t);
    free(t2);
}

static void test_vllm(void) {
    char *t;
    kv_remote_metrics m;
    kv_metrics_adapter *a =
        first_scrape("tests/fixtures/attach/vllm_metrics.txt", KV_SOURCE_VLLM, 12, 5, 0.625, &t, &m);
    REQUIRE(a);
    CHECK((m.have & KV_RM_WAIT_REASON) && m.wait_capacity == 4 && m.wait_deferred == 1);
    CHECK((m.have & KV_RM_CACHE_CFG) && m.block_size == 16 && m.num_blocks == 27000 && !strcmp(m.cache_dtype, "auto"));
    CHECK(!(m.have & KV_RM_TTFT)); /* percentiles need a window: nothing yet */
    /* ten seconds later every counter and bucket has doubled; gauges too:
     * running 24, usage 1.25 (the adapter reports what the server says) */
    char *t2 = doubled_scrape(a, t, "vllm:", &m);
    REQUIRE(t2);
    CHECK(m.running == 24);
    CHECK((m.have & KV_RM_TOKS) && near(m.gen_tok_s, 18000 / 10.0) && near(m.prompt_tok_s, 52000 / 10.0));
    CHECK((m.have & KV_RM_PREFIX) && near(m.prefix_hit_rate, 10000.0 / 40000.0));
    CHECK((m.have & KV_RM_PREEMPT) && near(m.preempt_per_s, 0.3));
    CHECK((m.have & KV_RM_SPEC) && near(m.spec_accept, 1800.0 / 3000.0));
    CHECK((m.have & KV_RM_SPEC_LEN) && near(m.spec_accept_len, 1 + 1800.0 / 1000.0));
    CHECK((m.have & KV_RM_SPEC_POS) && m.n_spec_pos == 3 && near(m.spec_pos[0], 0.8) && near(m.spec_pos[2], 0.4));
    /* TTFT delta = the first scrape's counts: 100 observations, cumulative
     * 0,0,0,2,7,17,32,52,77,87,92,96,99,100 over le 0.001..5.0. P50: rank
     * 50 lies in (0.08, 0.1] (32..52): 0.08 + 0.02 * 18 / 20 = 0.098 s. P90:
     * rank 90 in (0.5, 0.75] (87..92): 0.5 + 0.25 * 3 / 5 = 0.65 s. P99: rank
     * 99 in (1.0, 2.5] (96..99): 1.0 + 1.5 * 3 / 3 = 2.5 s. */
    CHECK(m.have & KV_RM_TTFT);
    CHECKF(near(m.ttft_ms[0], 98) && near(m.ttft_ms[1], 650) && near(m.ttft_ms[2], 2500), "ttft %g %g %g",
           m.ttft_ms[0], m.ttft_ms[1], m.ttft_ms[2]);
    CHECK((m.have & KV_RM_ITL) && (m.have & KV_RM_E2E) && m.itl_ms[0] > 0 && m.e2e_ms[2] >= m.e2e_ms[0]);
    kv_snapshot *s = kv_snapshot_new();
    REQUIRE(s);
    kv_metrics_to_snapshot(&m, s);
    CHECK(s->metrics.ttft_ms.valid && near(s->metrics.ttft_ms.p90, 650) && s->n_blocks == 0 && s->block_size == 16);
    CHECK(near(s->metrics.output_tokens_per_s, 1800) && near(s->metrics.prefix_hit_rate, 0.25));
    kv_snapshot_free(s);
    scrapes_free(a, t, t2);
}

static void test_sglang(void) {
    char *t;
    kv_remote_metrics m;
    kv_metrics_adapter *a =
        first_scrape("tests/fixtures/attach/sglang_metrics.txt", KV_SOURCE_SGLANG, 7, 2, 0.28, &t, &m);
    REQUIRE(a);
    CHECK((m.have & KV_RM_KV_TOKENS) && m.kv_used_tokens == 40000 && m.kv_total_tokens == 161721);
    CHECK((m.have & KV_RM_PREFIX) && near(m.prefix_hit_rate, 0.4));
    CHECK((m.have & KV_RM_SPEC) && near(m.spec_accept, 0.5) && near(m.spec_accept_len, 2.5));
    CHECK(!(m.have & KV_RM_CACHE_CFG));
    /* ten seconds later everything doubled: the hit rate now from the
     * counters (3e6 cached of 8e6 prompt tokens), not the gauge (0.8) */
    char *t2 = doubled_scrape(a, t, "sglang:", &m);
    REQUIRE(t2);
    CHECKF((m.have & KV_RM_PREFIX) && near(m.prefix_hit_rate, 0.375), "%g", m.prefix_hit_rate);
    CHECK((m.have & KV_RM_TOKS) && near(m.gen_tok_s, 755757.2) && near(m.prompt_tok_s, 800000));
    CHECK((m.have & KV_RM_PREEMPT) && near(m.preempt_per_s, 0.4));
    /* TTFT with SGLang's default buckets, cumulative 10,30,60,80,90,95,99,100
     * over le 0.1,0.2,0.4,0.6,0.8,1,2,4: P50 in (0.2, 0.4]: 0.2 + 0.2 * 20/30;
     * P90 = 0.8 (the top of its bucket); P99 = 2.0 */
    CHECKF((m.have & KV_RM_TTFT) && near(m.ttft_ms[0], 200 + 200 * 20.0 / 30) && near(m.ttft_ms[1], 800) &&
               near(m.ttft_ms[2], 2000), "ttft %g %g %g", m.ttft_ms[0], m.ttft_ms[1], m.ttft_ms[2]);
    /* queue_time_seconds starts at le 0.0: cumulative 40, 70 over 0.0, 0.1
     * (95 in all): P50 (rank 47.5) in (0, 0.1]: 0.1 * 7.5 / 30 */
    CHECKF((m.have & KV_RM_QUEUE_TIME) && near(m.queue_ms[0], 100 * 7.5 / 30), "queue %g", m.queue_ms[0]);
    CHECK((m.have & KV_RM_ITL) && (m.have & KV_RM_E2E));
    scrapes_free(a, t, t2);
    CHECK(kv_metrics_detect_kind("tgi_queue_size 3\n", 17) == KV_SOURCE_TGI);
    CHECK(kv_metrics_detect_kind("garbage\n", 8) == KV_SOURCE_AUTO);
    CHECK(kv_metrics_adapter_new(KV_SOURCE_KVTOP, 60) == NULL);
}

/* TGI's fixture (checked against its router source): queue and batch
 * gauges, token totals from histogram sums, and percentiles with its
 * geometric duration buckets 0.0001 * 1.5^k. */
static void test_tgi(void) {
    char *t;
    kv_remote_metrics m;
    kv_metrics_adapter *a = first_scrape("tests/fixtures/attach/tgi_metrics.txt", KV_SOURCE_TGI, 8, 3, 0, &t, &m);
    REQUIRE(a);
    CHECK((m.have & KV_RM_BATCH) && m.batch_size == 8);
    CHECK(!(m.have & KV_RM_KV_USAGE) && !(m.have & KV_RM_PREFIX) && !(m.have & KV_RM_TTFT));
    char *t2 = doubled_scrape(a, t, "tgi_", &m);
    REQUIRE(t2);
    CHECK((m.have & KV_RM_TOKS) && near(m.gen_tok_s, 2560) && near(m.prompt_tok_s, 6144));
    CHECK(!(m.have & KV_RM_TTFT)); /* TGI has no time-to-first-token metric */
    /* queue: cumulative 20, 60 at le b10, b11 (b_i = 0.0001 * 1.5^(i+1)), 100 in
     * all: P50 (rank 50) = b10 + (b11 - b10) * 30 / 40 */
    double b10 = 0.0001 * pow(1.5, 11), b11 = 0.0001 * pow(1.5, 12);
    CHECKF((m.have & KV_RM_QUEUE_TIME) && near(m.queue_ms[0], 1000 * (b10 + (b11 - b10) * 30 / 40)), "queue %g",
           m.queue_ms[0]);
    /* mean time per token: 5, 40, 90, 100 at b8..b11: P50 = b9 + (b10 - b9) * 10 / 50 */
    double b9 = 0.0001 * pow(1.5, 10);
    CHECKF((m.have & KV_RM_ITL) && near(m.itl_ms[0], 1000 * (b9 + (b10 - b9) * 10 / 50)), "itl %g", m.itl_ms[0]);
    CHECK((m.have & KV_RM_E2E) && m.e2e_ms[2] >= m.e2e_ms[0]);
    scrapes_free(a, t, t2);
}

/* What F7 keeps of a metrics source: the KV cache in use as block counts
 * and llama-server's busy slots as request rows, one frame per scrape,
 * read back from the trace as written. */
static void test_record_metrics(void) {
    kv_remote_metrics m;
    kv_metrics_adapter *a =
        first_scrape("tests/fixtures/attach/vllm_metrics.txt", KV_SOURCE_VLLM, 12, 5, 0.625, NULL, &m);
    REQUIRE(a);
    kv_metrics_adapter_free(a);
    kv_snapshot *s = kv_snapshot_new();
    REQUIRE(s);
    kv_metrics_to_snapshot(&m, s);
    CHECK(s->blocks_used == 16875 && s->blocks_free == 10125 && s->n_blocks == 0 && s->block_size == 16);
    size_t slen;
    char *sl = slurp(harness_shared_path("fixtures/llama-server/slots.json"), &slen);
    REQUIRE(sl);
    kv_source_slot slots[KV_SOURCE_MAX_SLOTS];
    kv_err err;
    int n = kv_metrics_parse_slots(sl, slen, slots, KV_SOURCE_MAX_SLOTS, &err);
    free(sl);
    REQUIRE(n == 16);
    slots[3].busy = 0; /* an idle slot has no row */
    CHECK(kv_metrics_slots_to_snapshot(slots, n, s) == 0);
    CHECK(s->n_requests == 15 && s->n_running == 15 && s->requests[0].id == 88 && s->running[0] == 88);
    CHECK(s->requests[0].state == KV_REQ_RUNNING && s->requests[0].n_generated == slots[0].n_decoded &&
          s->requests[0].max_tokens == slots[0].n_decoded + 64);
    char path[] = "/tmp/kvtop-test-rec-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    close(fd);
    kv_trace_writer *w = kv_trace_writer_open(path, NULL, &err);
    REQUIRE(w);
    s->step = 1;
    CHECK(kv_trace_writer_add(w, s) == 1);
    s->step = 2;
    s->blocks_used = 17000;
    s->blocks_free = 10000;
    CHECK(kv_trace_writer_add(w, s) == 1);
    CHECK(kv_trace_writer_close(w) == 0);
    kv_trace *t = kv_trace_load(path, &err);
    CHECKF(t != NULL, "%s", err.msg);
    if (t) {
        CHECK(kv_trace_n_frames(t) == 2);
        const kv_snapshot *f0 = kv_trace_frame(t, 0);
        CHECK(f0 && f0->blocks_used == 16875 && f0->n_requests == 15 && f0->requests[14].id == s->requests[14].id);
        const kv_snapshot *f1 = kv_trace_frame(t, 1);
        CHECK(f1 && f1->blocks_used == 17000 && f1->n_running == 15);
        kv_trace_free(t);
    }
    unlink(path);
    kv_snapshot_free(s);
}

static void test_garbage_lines(void) {
    const char *t = "vllm:num_requests_running{engine=\"0\"} 3\nnonsense here\nvllm:num_requests_waiting 1\n{{{\n";
    kv_metrics_adapter *a = kv_metrics_adapter_new(KV_SOURCE_VLLM, 60);
    REQUIRE(a);
    kv_remote_metrics m;
    char bad[200];
    CHECK(kv_metrics_adapter_feed(a, t, strlen(t), 0, &m, bad, sizeof bad) == 2);
    CHECK(strstr(bad, "line 2") != NULL);
    CHECK(m.running == 3 && m.waiting == 1);
    kv_metrics_adapter_free(a);
}

typedef struct events {
    int n;
    char last[256];
    int stop_after;
} events;

static int on_ev(void *user, const char *data, size_t len) {
    events *e = user;
    e->n++;
    snprintf(e->last, sizeof e->last, "%.*s", (int)len, data);
    return e->stop_after && e->n >= e->stop_after;
}

static void test_sse(void) {
    const char *s = ": comment\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: line1\ndata:line2\n\n\ndata: [DONE]\n\n";
    size_t n = strlen(s);
    /* every split into two feeds gives the same three events */
    for (size_t cut = 0; cut <= n; cut++) {
        kv_sse_parser p;
        kv_sse_init(&p, 1024);
        events e = {0};
        CHECK(kv_sse_feed(&p, s, cut, on_ev, &e) == 0);
        CHECK(kv_sse_feed(&p, s + cut, n - cut, on_ev, &e) == 0);
        CHECKF(e.n == 3 && !strcmp(e.last, "[DONE]"), "cut %zu: %d events", cut, e.n);
        kv_sse_free(&p);
    }
    kv_sse_parser p;
    kv_sse_init(&p, 1024);
    events e = {0};
    kv_sse_feed(&p, "data: line1\ndata:line2\n\n", 24, on_ev, &e);
    CHECK(!strcmp(e.last, "line1\nline2"));
    e.stop_after = 2;
    CHECK(kv_sse_feed(&p, "data: b\n\ndata: c\n\n", 18, on_ev, &e) == 1); /* the callback stops it */
    kv_sse_free(&p);
    /* an event over the cap is an error, sticky */
    kv_sse_init(&p, 16);
    CHECK(kv_sse_feed(&p, "data: 0123456789abcdef\n\n", 24, on_ev, &e) == KV_ERR_FORMAT);
    CHECK(kv_sse_feed(&p, "data: x\n\n", 9, on_ev, &e) == KV_ERR_FORMAT);
    kv_sse_free(&p);
}

static void append(void *user, const char *t, size_t n) {
    char *buf = user;
    strncat(buf, t, n);
}

static void test_chat_chunks(void) {
    kv_remote_chat_news n;
    memset(&n, 0, sizeof n);
    n.cache_n = n.prompt_n = -1;
    char text[256] = "";
    const char *c1 = "{\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Par\"}}]}";
    const char *c2 = "{\"choices\":[{\"delta\":{\"content\":\"is\"},\"finish_reason\":\"stop\"}],"
                     "\"timings\":{\"cache_n\":12,\"prompt_n\":30}}";
    CHECK(kv_remote_chat_event(c1, strlen(c1), &n, append, text) == 0);
    CHECK(kv_remote_chat_event(c2, strlen(c2), &n, append, text) == 0);
    CHECK(!strcmp(text, "Paris") && !strcmp(n.finish, "stop") && n.cache_n == 12 && n.prompt_n == 30);
    CHECK(kv_remote_chat_event("[DONE]", 6, &n, append, text) == 1);
    CHECK(kv_remote_chat_event("{oops", 5, &n, append, text) == KV_ERR_FORMAT && strstr(n.error, "bad chunk"));
    const char *e = "{\"error\":{\"message\":\"model not found\"}}";
    CHECK(kv_remote_chat_event(e, strlen(e), &n, append, text) == KV_ERR_FORMAT && strstr(n.error, "model not found"));
    CHECK(kv_remote_chat_event("{\"x\":1}", 7, &n, append, text) == KV_ERR_FORMAT);
    const char *roles[] = {"system", "user"}, *texts[] = {"be \"brief\"", "hi\n"};
    kv_remote_chat_params p = {roles, texts, 2, 32, 0};
    size_t len;
    char *body = kv_remote_chat_body(&p, "m", &len);
    REQUIRE(body);
    CHECK(strstr(body, "\"stream\":true") && strstr(body, "\"max_tokens\":32") && strstr(body, "\"temperature\":0"));
    CHECK(strstr(body, "be \\\"brief\\\"") && strstr(body, "hi\\n"));
    free(body);
}

static void test_reasons_and_urls(void) {
    CHECK(kv_source_na_reason(KV_SOURCE_KVTOP, KV_SF_BLOCKS) == NULL);
    CHECK(strstr(kv_source_na_reason(KV_SOURCE_VLLM, KV_SF_BLOCKS), "no per-block state"));
    CHECK(strstr(kv_source_na_reason(KV_SOURCE_LLAMACPP, KV_SF_KV_USAGE), "removed its KV usage metric"));
    CHECK(kv_source_na_reason(KV_SOURCE_SGLANG, KV_SF_QUEUES) == NULL);
    kv_source_kind k;
    CHECK(kv_source_kind_parse("sglang", &k) == 0 && k == KV_SOURCE_SGLANG);
    CHECK(kv_source_kind_parse("nope", &k) == KV_ERR_INVAL && k == KV_SOURCE_SGLANG);
    char u[64];
    CHECK(kv_http_join(u, sizeof u, "http://h:1///", "/metrics") == 0 && !strcmp(u, "http://h:1/metrics"));
    CHECK(kv_http_join(u, 8, "http://h:1", "/metrics") == KV_ERR_RANGE);
    kv_err err;
    CHECK(kv_source_new("ftp://x", NULL, KV_SOURCE_AUTO, 100, &err) == NULL && err.code == KV_ERR_INVAL);
    CHECK(kv_source_new("http://x", "a\r\nX-Evil: 1", KV_SOURCE_AUTO, 100, &err) == NULL);
    kv_source *s = kv_source_new("http://127.0.0.1:1/", "k", KV_SOURCE_KVTOP, 100, &err);
    REQUIRE(s);
    CHECK(!strcmp(kv_source_url(s), "http://127.0.0.1:1"));
    kv_source_free(s); /* never started: frees without a thread */
}

TEST_MAIN(T(test_llama_server), T(test_vllm), T(test_sglang), T(test_tgi), T(test_record_metrics), T(test_garbage_lines), T(test_sse), T(test_chat_chunks),
          T(test_reasons_and_urls))
