/* test_bench.c - the headless benchmark as a library: --compare parsing,
 * a real run on stories260K (every request accounted for, exact lengths,
 * arrivals paced on the wall clock, closed-loop concurrency), the JSON and
 * JSONL it writes (read back with the JSON parser), the tables, and clean
 * failures on a bad workload or a missing model. */
#include <stdlib.h>
#include <string.h>

#include "../harness.h"
#include "../bench_helpers.h"
#include "../../engine/json.h"
#include "../../cli/bench.h"

static char *mem_text(void (*fill)(FILE *, void *), void *arg, size_t *len) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return NULL;
    fill(f, arg);
    fclose(f);
    if (len) *len = n;
    return buf;
}

static void small_config(kv_config *c) {
    test_bench_config(c, 4, 6, 12);
    c->scheduler.max_seq_len = 512;
    c->workload.output_len = (kv_dist){.kind = KV_DIST_UNIFORM, .min = 4, .max = 20};
    c->workload.seed = 3;
    c->workload.system_prompt_len = 0;
    c->workload.prompts_file[0] = 0;
}

static void test_parse_compare(void) {
    char buf[256];
    const char *key, *v[4];
    kv_err err;
    CHECK(kv_bench_parse_compare("scheduler.policy=continuous,static", buf, sizeof buf, &key, v, 4, &err) == 2);
    CHECK(!strcmp(key, "scheduler.policy") && !strcmp(v[0], "continuous") && !strcmp(v[1], "static"));
    /* a distribution is one value: its commas are inside braces */
    CHECK(kv_bench_parse_compare("workload.prompt_len={dist: uniform, min: 8, max: 64}, 16", buf, sizeof buf, &key, v,
                                 4, &err) == 2);
    CHECK(!strcmp(v[0], "{dist: uniform, min: 8, max: 64}") && !strcmp(v[1], "16"));
    CHECK(kv_bench_parse_compare("k=1", buf, sizeof buf, &key, v, 4, &err) == 1 && !strcmp(v[0], "1"));
    CHECK(kv_bench_parse_compare("novalue", buf, sizeof buf, &key, v, 4, &err) == -1 && strstr(err.msg, "novalue"));
    CHECK(kv_bench_parse_compare("=1,2", buf, sizeof buf, &key, v, 4, &err) == -1);
    CHECK(kv_bench_parse_compare("k=1,,2", buf, sizeof buf, &key, v, 4, &err) == -1 && strstr(err.msg, "empty"));
    CHECK(kv_bench_parse_compare("k=", buf, sizeof buf, &key, v, 4, &err) == -1);
    CHECK(kv_bench_parse_compare("k=1,2,3,4,5", buf, sizeof buf, &key, v, 4, &err) == -1 && strstr(err.msg, "4"));
    CHECK(!strcmp(kv_bench_finish_name(KV_FINISH_LENGTH), "length") &&
          !strcmp(kv_bench_finish_name(KV_FINISH_REJECTED), "rejected"));
}

/* Items' drawn output lengths, to compare with what was generated. */
static int drawn_output(const kv_config *c, int i) {
    kv_workload *w = kv_workload_build(c, NULL);
    const kv_workload_item *it = kv_workload_get(w, i);
    int n = it ? it->output_tokens : -1;
    kv_workload_free(w);
    return n;
}

static void print_one(FILE *f, void *arg) { kv_bench_print(f, "p.yaml", arg); }
static void json_one(FILE *f, void *arg) { kv_bench_write_json(f, "p.yaml", NULL, arg, 1); }
static void outputs_one(FILE *f, void *arg) { kv_bench_write_outputs(f, arg); }

static void test_run_burst(void) {
    kv_config c;
    small_config(&c);
    kv_bench_result r;
    kv_err err;
    int rc = kv_bench_run(&c, NULL, &r, &err);
    REQUIRE(rc == 0);
    CHECK(r.n_requests == 6 && r.completed == 6 && r.rejected == 0 && r.errors == 0);
    uint64_t want_out = 0;
    for (int i = 0; i < 6; i++) {
        const kv_bench_req *q = &r.reqs[i];
        int want = drawn_output(&c, i);
        want_out += (uint64_t)want;
        CHECKF(q->output_tokens == want && q->finish == KV_FINISH_LENGTH, "req %d: %d tokens (want %d), %s", i,
               q->output_tokens, want, kv_bench_finish_name(q->finish));
        CHECK(q->prompt_tokens == 13); /* BOS + 12 */
        CHECK(q->text && q->text[0]);
    }
    CHECK(r.output_tokens == want_out && r.m.output_tokens == want_out);
    CHECK(r.m.input_tokens == 6 * 13 && r.m.prefill_tokens_computed == 6 * 13);
    CHECK(r.m.max_concurrent >= 1 && r.m.max_concurrent <= 4);
    CHECK(r.kv_bytes_per_token == 640 && r.kv_block_size == 16 && r.kv_blocks_total > 0);
    CHECK(r.wall_s > 0 && r.m.output_tokens_per_s > 0);
    CHECK(r.m.ttft_ms.valid && r.m.ttft_ms.p50 <= r.m.ttft_ms.p99 && r.m.e2e_ms.p50 >= r.m.ttft_ms.p50);

    /* the JSON reads back with the keys the acceptance checks use */
    size_t len;
    char *js = mem_text(json_one, &r, &len);
    REQUIRE(js);
    kv_json *d = kv_json_parse(js, len, &err);
    CHECKF(d != NULL, "%s", err.msg);
    CHECK(kv_json_number(kv_json_get(d, "requests_completed")) == 6);
    CHECK(kv_json_number(kv_json_get(d, "output_tokens_per_s")) == r.m.output_tokens_per_s);
    CHECK(kv_json_number(kv_json_get(kv_json_get(d, "ttft_ms"), "p50")) == r.m.ttft_ms.p50);
    CHECK(kv_json_number(kv_json_get(d, "kv_bytes_per_token")) == 640);
    const kv_json *cfg = kv_json_get(d, "config");
    CHECK(kv_json_number(kv_json_get(kv_json_get(cfg, "scheduler"), "max_seqs")) == 4);
    CHECK(!strcmp(kv_json_str(kv_json_get(kv_json_get(cfg, "workload"), "arrival"), NULL), "burst"));
    const kv_json *ol = kv_json_get(kv_json_get(cfg, "workload"), "output_len");
    CHECK(!strcmp(kv_json_str(kv_json_get(ol, "dist"), NULL), "uniform") && kv_json_number(kv_json_get(ol, "max")) == 20);
    CHECK(strstr(kv_json_str(kv_json_get(d, "config_yaml"), NULL), "max_seqs: 4") != NULL);
    CHECK(kv_json_get(d, "value") == NULL);
    kv_json_free(d);
    free(js);

    /* the outputs: one line per request, in order, with the generated text */
    char *jl = mem_text(outputs_one, &r, &len);
    REQUIRE(jl);
    int lines = 0;
    for (char *p = jl, *nl; (nl = strchr(p, '\n')); p = nl + 1, lines++) {
        kv_json *o = kv_json_parse(p, (size_t)(nl - p), &err);
        CHECKF(o != NULL, "line %d: %s", lines, err.msg);
        CHECK(kv_json_number(kv_json_get(o, "index")) == lines);
        if (lines < 6) {
            CHECK(!strcmp(kv_json_str(kv_json_get(o, "text"), NULL), r.reqs[lines].text));
            CHECK(kv_json_number(kv_json_get(o, "output_tokens")) == r.reqs[lines].output_tokens);
        }
        CHECK(!strcmp(kv_json_str(kv_json_get(o, "finish"), NULL), "length"));
        kv_json_free(o);
    }
    CHECK(lines == 6);
    free(jl);

    char *tab = mem_text(print_one, &r, NULL);
    REQUIRE(tab);
    CHECK(strstr(tab, "6 completed, 0 rejected") && strstr(tab, "TTFT") && strstr(tab, "640 B/token"));
    CHECK(!strstr(tab, "speculative")); /* spec off: no row */
    free(tab);

    /* a second run gives the same greedy text, a bigger batch too */
    kv_bench_result r2;
    c.scheduler.max_seqs = 1;
    REQUIRE(kv_bench_run(&c, NULL, &r2, &err) == 0);
    CHECK(r2.m.max_concurrent == 1);
    for (int i = 0; i < 6; i++) CHECKF(!strcmp(r.reqs[i].text, r2.reqs[i].text), "req %d differs", i);
    kv_bench_result_free(&r2);
    kv_bench_result_free(&r);
    CHECK(r.reqs == NULL && r.n_requests == 0);
    kv_bench_result_free(NULL);
}

static void test_run_arrivals(void) {
    kv_config c;
    small_config(&c);
    kv_bench_result r;
    kv_err err;
    /* poisson: the run cannot end before the last request arrived */
    c.workload.arrival = KV_ARRIVAL_POISSON;
    c.workload.rate = 50;
    c.workload.requests = 8;
    kv_workload *w = kv_workload_build(&c, &err);
    REQUIRE(w);
    double last = kv_workload_get(w, 7)->arrival_s;
    kv_workload_free(w);
    REQUIRE(kv_bench_run(&c, NULL, &r, &err) == 0);
    CHECKF(r.wall_s >= last && r.completed == 8, "wall %.3f s, last arrival %.3f s", r.wall_s, last);
    kv_bench_result_free(&r);
    /* closed loop: never more than `concurrency` in flight */
    c.workload.arrival = KV_ARRIVAL_CLOSED;
    c.workload.concurrency = 2;
    c.scheduler.max_seqs = 8;
    REQUIRE(kv_bench_run(&c, NULL, &r, &err) == 0);
    CHECK(r.completed == 8 && r.m.max_concurrent >= 1 && r.m.max_concurrent <= 2);
    kv_bench_result_free(&r);
}

static void test_run_errors(void) {
    kv_config c;
    small_config(&c);
    kv_bench_result r;
    kv_err err;
    snprintf(c.workload.prompts_file, sizeof c.workload.prompts_file, "/nonexistent/prompts.jsonl");
    CHECK(kv_bench_run(&c, NULL, &r, &err) == KV_ERR_INVAL && strstr(err.msg, "prompts.jsonl"));
    CHECK(r.reqs == NULL && r.n_requests == 0);
    small_config(&c);
    snprintf(c.model.path, sizeof c.model.path, "/nonexistent/model.gguf");
    int rc = kv_bench_run(&c, NULL, &r, &err);
    CHECK(rc < 0 && rc != KV_ERR_INVAL && strstr(err.msg, "model.gguf"));
    CHECK(kv_bench_run(NULL, NULL, &r, &err) == KV_ERR_INVAL);
    CHECK(kv_bench_run(&c, NULL, NULL, &err) == KV_ERR_INVAL);
}

typedef struct cmp_arg {
    kv_bench_result *runs;
    int n;
} cmp_arg;
static void print_cmp(FILE *f, void *arg) {
    cmp_arg *a = arg;
    kv_bench_print_compare(f, "p.yaml", "scheduler.policy", a->runs, a->n);
}
static void json_cmp(FILE *f, void *arg) {
    cmp_arg *a = arg;
    kv_bench_write_json(f, "p.yaml", "scheduler.policy", a->runs, a->n);
}

static void test_compare_output(void) {
    kv_bench_result runs[2];
    memset(runs, 0, sizeof runs);
    kv_config_default(&runs[0].cfg);
    runs[1].cfg = runs[0].cfg;
    runs[1].cfg.scheduler.policy = KV_POLICY_STATIC;
    snprintf(runs[0].value, sizeof runs[0].value, "continuous");
    snprintf(runs[1].value, sizeof runs[1].value, "static");
    runs[0].m.output_tokens_per_s = 200;
    runs[1].m.output_tokens_per_s = 50;
    runs[0].m.ttft_ms = (kv_stat){.valid = 1, .p50 = 10, .p90 = 20, .p99 = 30, .mean = 12, .n = 4};
    runs[0].completed = runs[1].completed = 4;
    cmp_arg a = {runs, 2};
    char *t = mem_text(print_cmp, &a, NULL);
    REQUIRE(t);
    CHECK(strstr(t, "continuous") && strstr(t, "static"));
    CHECK(strstr(t, "50.0 (0.25x)") != NULL); /* output tok/s, ratio to the first column */
    CHECK(strstr(t, "N/A") != NULL);          /* run 2 has no TTFT samples */
    CHECK(!strstr(t, "spec acceptance"));
    free(t);
    size_t len;
    char *js = mem_text(json_cmp, &a, &len);
    REQUIRE(js);
    kv_err err;
    kv_json *d = kv_json_parse(js, len, &err);
    CHECKF(d != NULL, "%s", err.msg);
    const kv_json *rs = kv_json_get(d, "runs");
    CHECK(kv_json_len(rs) == 2);
    CHECK(!strcmp(kv_json_str(kv_json_get(kv_json_at(rs, 1), "value"), NULL), "static"));
    CHECK(kv_json_type_of(kv_json_get(kv_json_get(kv_json_at(rs, 1), "ttft_ms"), "p50")) == KV_JSON_NULL);
    CHECK(kv_json_number(kv_json_get(kv_json_get(kv_json_at(rs, 0), "ttft_ms"), "p99")) == 30);
    kv_json_free(d);
    free(js);
}

TEST_MAIN(T(test_parse_compare), T(test_run_burst), T(test_run_arrivals), T(test_run_errors), T(test_compare_output))
