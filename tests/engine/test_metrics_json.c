/* test_metrics_json.c - the one metrics-summary JSON writer: every figure
 * appears under its name with its value, statistics without samples keep
 * their keys (null figures, n 0), and the output parses back. */
#include "../harness.h"

#include "../../engine/json.h"
#include "../../engine/metrics_json.h"

static kv_json *write_and_parse(const kv_metrics_summary *m) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    kv_json_writer w;
    kv_json_writer_init(&w, f, 0);
    kv_json_write_begin_object(&w);
    kv_metrics_write_json(&w, m);
    kv_json_write_end_object(&w);
    int rc = kv_json_writer_finish(&w);
    fclose(f);
    CHECK(rc == 0);
    kv_err err;
    kv_json *d = kv_json_parse(buf, len, &err);
    CHECKF(d != NULL, "%s", buf);
    free(buf);
    return d;
}

static void test_fields_and_values(void) {
    kv_metrics_summary m;
    memset(&m, 0, sizeof m);
    m.output_tokens = 1234;
    m.output_tokens_per_s = 56.25;
    m.prefix_hit_tokens = 77;
    m.max_concurrent = 9;
    m.spec_pos_accepted[3] = 5;
    m.ttft_ms = (kv_stat){.valid = 1, .n = 4, .mean = 2, .p50 = 1.5, .p90 = 3, .p99 = 3.5, .max = 4};
    kv_json *d = write_and_parse(&m);
    if (!d) return;
    CHECK(kv_json_number(kv_json_get(d, "output_tokens")) == 1234);
    CHECK(kv_json_number(kv_json_get(d, "output_tokens_per_s")) == 56.25);
    CHECK(kv_json_number(kv_json_get(d, "prefix_hit_tokens")) == 77);
    CHECK(kv_json_number(kv_json_get(d, "max_concurrent")) == 9);
    const kv_json *pa = kv_json_get(d, "spec_pos_accepted");
    CHECK(pa && kv_json_len(pa) == KV_ARRAY_LEN(m.spec_pos_accepted) && kv_json_number(kv_json_at(pa, 3)) == 5);
    const kv_json *t = kv_json_get(d, "ttft_ms");
    CHECK(kv_json_number(kv_json_get(t, "p50")) == 1.5 && kv_json_number(kv_json_get(t, "p99")) == 3.5);
    CHECK(kv_json_number(kv_json_get(t, "n")) == 4);
    /* a statistic with no samples keeps every key, with null figures */
    const kv_json *e = kv_json_get(d, "e2e_ms");
    CHECK(e && kv_json_type_of(kv_json_get(e, "p99")) == KV_JSON_NULL);
    CHECK(kv_json_number(kv_json_get(e, "n")) == 0);
    const char *names[] = {"input_tokens", "prefill_tokens_computed", "goodput_requests_per_s", "queue_ms",
                           "tpot_ms", "itl_ms", "kv_utilization", "prefix_hit_rate", "preemptions", "swaps_out",
                           "swaps_in", "spec_drafted", "spec_acceptance_rate", "sim_device_s", "elapsed_s",
                           "decode_step_tokens_per_s"};
    for (size_t i = 0; i < KV_ARRAY_LEN(names); i++) CHECKF(kv_json_get(d, names[i]) != NULL, "%s", names[i]);
    kv_json_free(d);
}

TEST_MAIN(T(test_fields_and_values))
