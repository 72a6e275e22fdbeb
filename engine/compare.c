/* compare.c - "key=v1,v2" parsing and the figures of a comparison (see
 * compare.h). */
#include "compare.h"

#include <string.h>

int kv_compare_parse(const char *arg, char *buf, size_t buf_cap, const char **key, const char **values, int cap,
                     kv_err *err) {
    if (!arg || !buf || !key || !values || cap < 1) {
        kv_err_set(err, KV_ERR_INVAL, "--compare: bad arguments");
        return -1;
    }
    size_t len = strlen(arg);
    if (len + 1 > buf_cap) {
        kv_err_set(err, KV_ERR_INVAL, "--compare: argument too long");
        return -1;
    }
    memcpy(buf, arg, len + 1);
    char *eq = strchr(buf, '=');
    if (!eq || eq == buf) {
        kv_err_set(err, KV_ERR_INVAL, "--compare '%s': expected key=value1,value2,...", arg);
        return -1;
    }
    *eq = 0;
    *key = buf;
    char *p = eq + 1;
    int n = 0, depth = 0;
    char *start = p;
    for (;; p++) {
        if (*p == '{' || *p == '[') depth++;
        else if ((*p == '}' || *p == ']') && depth > 0) depth--;
        if (*p == 0 || (*p == ',' && depth == 0)) {
            int end = *p == 0;
            *p = 0;
            /* trim spaces around a value */
            while (*start == ' ') start++;
            for (char *q = p - 1; q >= start && *q == ' '; q--) *q = 0;
            if (!*start) {
                kv_err_set(err, KV_ERR_INVAL, "--compare '%s': empty value", arg);
                return -1;
            }
            if (n == cap) {
                kv_err_set(err, KV_ERR_INVAL, "--compare '%s': more than %d values", arg, cap);
                return -1;
            }
            values[n++] = start;
            if (end) break;
            start = p + 1;
        }
    }
    kv_err_clear(err);
    return n;
}

static const struct {
    const char *name;
    int decimals;
} metric_info[KV_CMP_COUNT] = {
    [KV_CMP_OUT_TPS] = {"out tok/s", 1},   [KV_CMP_TTFT50] = {"TTFT p50", 0}, [KV_CMP_TTFT99] = {"TTFT p99", 0},
    [KV_CMP_MAXCONC] = {"running", 0},     [KV_CMP_KVUTIL] = {"KV util %", 1}, [KV_CMP_PREEMPT] = {"preempt", 0},
    [KV_CMP_PREFILL] = {"prefill tok", 0}, [KV_CMP_SPEC_ACC] = {"spec acc %", 1},
    [KV_CMP_IN_TPS] = {"in tok/s", 1},     [KV_CMP_RPS] = {"req/s", 2},        [KV_CMP_GOODPUT] = {"goodput req/s", 2},
    [KV_CMP_SLA] = {"SLA met %", 1},       [KV_CMP_TTFT90] = {"TTFT p90", 1},  [KV_CMP_TTFT_MEAN] = {"TTFT mean", 1},
    [KV_CMP_TPOT50] = {"TPOT p50", 2},     [KV_CMP_TPOT99] = {"TPOT p99", 2},  [KV_CMP_ITL50] = {"ITL p50", 2},
    [KV_CMP_ITL99] = {"ITL p99", 2},       [KV_CMP_E2E50] = {"E2E p50", 1},    [KV_CMP_E2E99] = {"E2E p99", 1},
    [KV_CMP_E2E_MEAN] = {"E2E mean", 1},   [KV_CMP_QUEUE50] = {"queue p50", 1}, [KV_CMP_PREFIX_RATE] = {"prefix hit %", 1},
    [KV_CMP_PREFIX_TOK] = {"prefix tok", 0}, [KV_CMP_SPEC_LEN] = {"spec len", 2}, [KV_CMP_SIM_TPS] = {"sim tok/s", 1},
    [KV_CMP_SIM_S] = {"sim s", 3},         [KV_CMP_RECOMPUTED] = {"recomputed", 0}, [KV_CMP_CHAINS] = {"cascades", 0},
    [KV_CMP_LONGEST_CHAIN] = {"longest chain", 0}, [KV_CMP_BATCH_CAP] = {"batch cap", 0},
};

const char *kv_compare_metric_name(kv_cmp_metric k) {
    return k >= 0 && k < KV_CMP_COUNT ? metric_info[k].name : "?";
}

int kv_compare_metric_decimals(kv_cmp_metric k) { return k >= 0 && k < KV_CMP_COUNT ? metric_info[k].decimals : 0; }

/* A percentile or mean of a latency distribution: none without a sample. */
static int stat_of(const kv_stat *st, double x, double *v) {
    *v = st->valid ? x : 0;
    return st->valid;
}

int kv_compare_metric(const kv_metrics_summary *m, kv_cmp_metric k, double *v) {
    *v = 0;
    if (!m) return 0;
    switch (k) {
    case KV_CMP_OUT_TPS: *v = m->output_tokens_per_s; return 1;
    case KV_CMP_TTFT50: return stat_of(&m->ttft_ms, m->ttft_ms.p50, v);
    case KV_CMP_TTFT99: return stat_of(&m->ttft_ms, m->ttft_ms.p99, v);
    case KV_CMP_MAXCONC: *v = m->max_concurrent; return 1;
    case KV_CMP_KVUTIL: *v = 100.0 * m->kv_utilization; return 1;
    case KV_CMP_PREEMPT: *v = (double)m->preemptions; return 1;
    case KV_CMP_PREFILL: *v = (double)m->prefill_tokens_computed; return 1;
    case KV_CMP_SPEC_ACC: *v = 100.0 * m->spec_acceptance_rate; return m->spec_drafted > 0;
    case KV_CMP_IN_TPS: *v = m->input_tokens_per_s; return 1;
    case KV_CMP_RPS: *v = m->requests_per_s; return 1;
    case KV_CMP_GOODPUT: *v = m->goodput_requests_per_s; return 1;
    case KV_CMP_SLA: *v = 100.0 * m->sla_attainment; return 1;
    case KV_CMP_TTFT90: return stat_of(&m->ttft_ms, m->ttft_ms.p90, v);
    case KV_CMP_TTFT_MEAN: return stat_of(&m->ttft_ms, m->ttft_ms.mean, v);
    case KV_CMP_TPOT50: return stat_of(&m->tpot_ms, m->tpot_ms.p50, v);
    case KV_CMP_TPOT99: return stat_of(&m->tpot_ms, m->tpot_ms.p99, v);
    case KV_CMP_ITL50: return stat_of(&m->itl_ms, m->itl_ms.p50, v);
    case KV_CMP_ITL99: return stat_of(&m->itl_ms, m->itl_ms.p99, v);
    case KV_CMP_E2E50: return stat_of(&m->e2e_ms, m->e2e_ms.p50, v);
    case KV_CMP_E2E99: return stat_of(&m->e2e_ms, m->e2e_ms.p99, v);
    case KV_CMP_E2E_MEAN: return stat_of(&m->e2e_ms, m->e2e_ms.mean, v);
    case KV_CMP_QUEUE50: return stat_of(&m->queue_ms, m->queue_ms.p50, v);
    case KV_CMP_PREFIX_RATE: *v = 100.0 * m->prefix_hit_rate; return 1;
    case KV_CMP_PREFIX_TOK: *v = (double)m->prefix_hit_tokens; return 1;
    case KV_CMP_SPEC_LEN: *v = m->spec_mean_accepted_len; return m->spec_drafted > 0;
    case KV_CMP_SIM_TPS: *v = m->sim_output_tokens_per_s; return m->sim_device_s > 0;
    case KV_CMP_SIM_S: *v = m->sim_device_s; return m->sim_device_s > 0;
    case KV_CMP_RECOMPUTED: *v = (double)m->tokens_recomputed; return 1;
    case KV_CMP_CHAINS: *v = (double)m->preemption_chains; return 1;
    case KV_CMP_LONGEST_CHAIN: *v = m->longest_preemption_chain; return 1;
    case KV_CMP_BATCH_CAP: *v = m->batch_cap; return m->batch_cap > 0;
    case KV_CMP_COUNT: break;
    }
    return 0;
}

int kv_compare_ratio(const kv_metrics_summary *m0, const kv_metrics_summary *m, kv_cmp_metric k, double *ratio) {
    double v0, v;
    *ratio = 0;
    if (!kv_compare_metric(m0, k, &v0) || !kv_compare_metric(m, k, &v) || v0 == 0) return 0;
    *ratio = v / v0;
    return 1;
}
