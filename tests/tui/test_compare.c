/* test_compare.c - the side-by-side screen's pure parts: "key=v1,v2"
 * parsing (shared with bench), the figures and ratios read from a metrics
 * summary, the header cells, and the layout of 1-4 columns at many
 * terminal sizes (inside the screen, no overlaps, the minimum enforced). */
#include <string.h>

#include "../harness.h"
#include "../../tui/compare_view.h"

static void test_parse(void) {
    char buf[256];
    const char *key, *v[KV_CMP_MAX];
    kv_err err;
    CHECK(kv_compare_parse("kv.layout=paged, contiguous", buf, sizeof buf, &key, v, KV_CMP_MAX, &err) == 2);
    CHECK(!strcmp(key, "kv.layout") && !strcmp(v[0], "paged") && !strcmp(v[1], "contiguous"));
    CHECK(kv_compare_parse("workload.prompt_len={dist: uniform, min: 8, max: 64},32", buf, sizeof buf, &key, v,
                           KV_CMP_MAX, &err) == 2);
    CHECK(!strcmp(v[0], "{dist: uniform, min: 8, max: 64}") && !strcmp(v[1], "32"));
    CHECK(kv_compare_parse("a=1,2,3,4,5", buf, sizeof buf, &key, v, KV_CMP_MAX, &err) == -1);
    CHECK(strstr(err.msg, "more than 4 values") != NULL);
    CHECK(kv_compare_parse("=1,2", buf, sizeof buf, &key, v, KV_CMP_MAX, &err) == -1);
    CHECK(kv_compare_parse("kv.layout", buf, sizeof buf, &key, v, KV_CMP_MAX, &err) == -1);
    CHECK(kv_compare_parse("k=1,,2", buf, sizeof buf, &key, v, KV_CMP_MAX, &err) == -1 && strstr(err.msg, "empty"));
    char tiny[4];
    CHECK(kv_compare_parse("k=1,2", tiny, sizeof tiny, &key, v, KV_CMP_MAX, &err) == -1);
}

static kv_metrics_summary summary(double tps, double ttft50, double ttft99, int conc, double util, int pre, int pf) {
    kv_metrics_summary m;
    memset(&m, 0, sizeof m);
    m.output_tokens_per_s = tps;
    m.ttft_ms.valid = ttft50 >= 0;
    m.ttft_ms.p50 = ttft50;
    m.ttft_ms.p99 = ttft99;
    m.max_concurrent = conc;
    m.kv_utilization = util;
    m.preemptions = (uint64_t)pre;
    m.prefill_tokens_computed = (uint64_t)pf;
    return m;
}

static void test_metrics(void) {
    /* the demo-paging figures bench printed: paged, then contiguous */
    kv_metrics_summary p = summary(4031.3, 165.6, 1608.5, 56, 0.956, 42, 10986);
    kv_metrics_summary c = summary(7182.1, 555.3, 1210.1, 6, 0.199, 0, 6717);
    double v, r;
    CHECK(kv_compare_metric(&p, KV_CMP_KVUTIL, &v) && fabs(v - 95.6) < 1e-9);
    CHECK(kv_compare_metric(&c, KV_CMP_MAXCONC, &v) && v == 6);
    CHECK(kv_compare_ratio(&p, &c, KV_CMP_OUT_TPS, &r) && fabs(r - 7182.1 / 4031.3) < 1e-12);
    CHECK(kv_compare_ratio(&p, &c, KV_CMP_TTFT50, &r) && fabs(r - 555.3 / 165.6) < 1e-12);
    CHECK(kv_compare_ratio(&p, &c, KV_CMP_PREFILL, &r) && fabs(r - 6717.0 / 10986.0) < 1e-12);
    CHECK(kv_compare_ratio(&p, &c, KV_CMP_PREEMPT, &r) && r == 0);
    /* no ratio to a zero, none without a sample */
    CHECK(!kv_compare_ratio(&c, &p, KV_CMP_PREEMPT, &r));
    kv_metrics_summary none = summary(0, -1, -1, 0, 0, 0, 0);
    CHECK(!kv_compare_metric(&none, KV_CMP_TTFT99, &v) && v == 0);
    CHECK(!kv_compare_ratio(&p, &none, KV_CMP_TTFT50, &r) && !kv_compare_ratio(&none, &p, KV_CMP_TTFT50, &r));
    /* acceptance only once something was drafted */
    CHECK(!kv_compare_metric(&p, KV_CMP_SPEC_ACC, &v));
    c.spec_drafted = 40;
    c.spec_accepted = 30;
    c.spec_acceptance_rate = 0.75;
    CHECK(kv_compare_metric(&c, KV_CMP_SPEC_ACC, &v) && fabs(v - 75.0) < 1e-9);
    CHECK(!kv_compare_ratio(&p, &c, KV_CMP_SPEC_ACC, &r));
    for (int k = 0; k < KV_CMP_COUNT; k++) CHECK(strcmp(kv_compare_metric_name((kv_cmp_metric)k), "?") != 0);
    CHECK(!strcmp(kv_compare_metric_name(KV_CMP_COUNT), "?"));
}

static void test_cells(void) {
    kv_metrics_summary p = summary(4031.3, 165.6, 1608.5, 56, 0.956, 42, 10986);
    kv_metrics_summary c = summary(7182.1, 555.3, 1210.1, 6, 0.199, 0, 6717);
    kv_metrics_summary none = summary(0, -1, -1, 0, 0, 0, 0);
    char b[48];
    kv_cmp_cell(b, sizeof b, &p, &p, KV_CMP_OUT_TPS, 1);
    CHECKF(!strcmp(b, "4031.3"), "[%s]", b);
    kv_cmp_cell(b, sizeof b, &p, &c, KV_CMP_OUT_TPS, 0);
    CHECKF(!strcmp(b, "7182.1 1.78x"), "[%s]", b); /* bench printed 1.78x */
    kv_cmp_cell(b, sizeof b, &p, &c, KV_CMP_MAXCONC, 0);
    CHECKF(!strcmp(b, "6 0.11x"), "[%s]", b);
    kv_cmp_cell(b, sizeof b, &p, &c, KV_CMP_KVUTIL, 0);
    CHECKF(!strcmp(b, "19.9 0.21x"), "[%s]", b);
    kv_cmp_cell(b, sizeof b, &c, &p, KV_CMP_PREEMPT, 0);
    CHECKF(!strcmp(b, "42 -"), "[%s]", b);
    kv_cmp_cell(b, sizeof b, &p, &none, KV_CMP_TTFT50, 0);
    CHECKF(!strcmp(b, "N/A"), "[%s]", b);
    /* every cell fits its column */
    for (int k = 0; k < KV_CMP_COUNT; k++) {
        kv_cmp_cell(b, sizeof b, &p, &c, (kv_cmp_metric)k, 0);
        CHECKF((int)strlen(b) < KV_CMP_CELL_W, "[%s]", b);
    }
}

static int inside(kv_rect r, int cols, int rows) {
    return r.h == 0 || (r.y >= 0 && r.x >= 0 && r.y + r.h <= rows && r.x + r.w <= cols);
}
static int overlap(kv_rect a, kv_rect b) {
    if (!kv_rect_visible(a) || !kv_rect_visible(b)) return 0;
    return a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
}

static void test_layout(void) {
    kv_cmp_layout l;
    CHECK(kv_cmp_layout_compute(200, 50, 0, 0, &l) == -1 && kv_cmp_layout_compute(200, 50, 5, 0, &l) == -1);
    CHECK(kv_cmp_layout_compute(-1, 50, 2, 0, &l) == -1 && kv_cmp_layout_compute(200, 5000, 2, 0, &l) == -1);
    CHECK(kv_cmp_layout_compute(79, 50, 2, 0, &l) == 0 && l.too_small);
    CHECK(kv_cmp_layout_compute(200, 23, 2, 0, &l) == 0 && l.too_small);
    CHECK(kv_cmp_layout_compute(159, 50, 4, 0, &l) == 0 && l.too_small); /* 4 x 40 */
    CHECK(kv_cmp_layout_compute(160, 50, 4, 0, &l) == 0 && !l.too_small);
    /* the acceptance size: two columns, every panel shown */
    CHECK(kv_cmp_layout_compute(200, 50, 2, 0, &l) == 0 && !l.too_small);
    CHECK(l.blocks[0].w == 100 && l.blocks[1].x == 100 && l.blocks[1].w == 100);
    CHECK(kv_rect_visible(l.tpot[0]) && kv_rect_visible(l.mem[1]) && l.chat[0].h >= 4);
    CHECK(l.head.h == 3 && l.caption.h == 0 && l.input.y == 48 && l.status.y == 49);
    /* the header: eight figures need 18 + 8 x 15 = 138 columns; narrower it wraps */
    CHECK(kv_cmp_head_per_line(138) == 8 && kv_cmp_head_per_line(137) == 7 && kv_cmp_head_per_line(80) == 4);
    CHECK(kv_cmp_head_per_line(10) == 1 && kv_cmp_head_rows(80, 2, 8) == 6 && kv_cmp_head_rows(80, 2, 7) == 6);
    CHECK(kv_cmp_head_rows(200, 4, 8) == 5 && kv_cmp_head_rows(120, 3, 8) == 8);
    CHECK(kv_cmp_layout_compute(80, 40, 2, 0, &l) == 0 && !l.too_small && l.head.h == 6 && l.head.w == 80);
    /* too short for the wrapped header: one group (cut at the width) */
    CHECK(kv_cmp_layout_compute(80, 24, 2, 1, &l) == 0 && !l.too_small && l.head.h == 6);
    CHECK(kv_cmp_layout_compute(120, 24, 3, 0, &l) == 0 && !l.too_small && l.head.h == 4);
    for (int n = 1; n <= KV_CMP_MAX; n++)
        for (int cols = 60; cols <= 330; cols += 7)
            for (int rows = 20; rows <= 90; rows += 3)
                for (int cap = 0; cap <= 1; cap++) {
                    if (kv_cmp_layout_compute(cols, rows, n, cap, &l)) {
                        CHECK(0);
                        continue;
                    }
                    if (l.too_small) {
                        CHECK(cols < n * KV_CMP_MIN_COL || cols < KV_LAYOUT_MIN_COLS || rows < KV_LAYOUT_MIN_ROWS);
                        continue;
                    }
                    kv_rect all[4 + 6 * KV_CMP_MAX];
                    int k = 0;
                    all[k++] = l.title, all[k++] = l.head, all[k++] = l.caption, all[k++] = l.input;
                    kv_rect st = l.status;
                    for (int j = 0; j < n; j++) {
                        all[k++] = l.label[j], all[k++] = l.blocks[j], all[k++] = l.sched[j];
                        all[k++] = l.tpot[j], all[k++] = l.mem[j], all[k++] = l.chat[j];
                        /* the map keeps a grid row between counts, gauge, chain and legend */
                        CHECKF(l.blocks[j].h >= 6 && l.sched[j].h >= 3 && l.chat[j].h >= 4, "%dx%d n%d", cols, rows, n);
                    }
                    int bad = !inside(st, cols, rows);
                    for (int a = 0; a < k; a++) {
                        bad |= !inside(all[a], cols, rows) || overlap(all[a], st);
                        for (int b = a + 1; b < k; b++) bad |= overlap(all[a], all[b]);
                    }
                    CHECKF(!bad, "%dx%d n%d caption %d", cols, rows, n, cap);
                    CHECK(cap ? l.caption.h == 1 : l.caption.h == 0);
                    /* the columns cover the width */
                    CHECK(l.blocks[n - 1].x + l.blocks[n - 1].w == cols);
                }
}

TEST_MAIN(T(test_parse), T(test_metrics), T(test_cells), T(test_layout))
