/* test_arch.c - the architectures past llama in the loader: every
 * `mkmodel --arch` file loads with its particular hyper-parameters and
 * tensors bound, the engine runs it, and files of a known architecture
 * with a missing or misshapen tensor or inconsistent metadata are refused
 * by the loader (and so by `kvtop info` and the engine, which use it)
 * with the tensor or key named. The forward pass of each architecture is
 * checked against llama.cpp by tests/e2e/arch_oracle.sh. */
#include <math.h>

#include "../../engine/engine.h"
#include "../../engine/forward.h"
#include "../../engine/gguf.h"
#include "../../engine/mkmodel.h"
#include "../../engine/model.h"
#include "../harness.h"

static const char *tmp(const char *tag) { return harness_tmp_path("arch", tag, ".gguf"); }

/* Writes a small random model of arch (extra settings by the caller's
 * mutator, may be NULL) to path; 0 or the writer's code. */
static int make(const char *arch, const char *path, void (*mut)(kv_mkmodel_params *)) {
    kv_mkmodel_params p = kv_mkmodel_default_params();
    p.arch = arch;
    p.dim = 128;
    p.n_layers = 6;
    p.ffn_dim = 256;
    if (mut) mut(&p);
    kv_err err;
    int rc = kv_mkmodel_write(&p, path, &err);
    if (rc) fprintf(stderr, "  mkmodel %s: %s\n", arch, err.msg);
    return rc;
}

static void gemma_shape(kv_mkmodel_params *p) {
    p->head_dim = 64;
    p->n_swa = 16;
}

static void moe_shape(kv_mkmodel_params *p) {
    p->head_dim = 32;
    p->n_experts = 8;
    p->n_experts_used = 2;
    p->ffn_dim = 64;
}

static void llama3_shape(kv_mkmodel_params *p) {
    p->rope_freqs = 1;
    p->rope_base = 500000.0f;
}

/* Each architecture's file loads with what is particular to it. */
static void test_load_each(void) {
    const char *pa = tmp("each");
    kv_err err;
    REQUIRE(make("gemma3", pa, gemma_shape) == 0);
    kv_model *m = kv_model_load(pa, NULL, &err);
    REQUIRE(m);
    CHECK(m->hp.arch_id == KV_ARCH_GEMMA3 && m->hp.act == KV_ACT_GELU_TANH && m->hp.rope_neox == 1);
    CHECK(m->hp.head_dim == 64 && m->hp.n_swa == 16 && m->hp.n_swa_layers == 5); /* layer 5 of 6 is global */
    CHECK(m->layers[0].swa && !m->layers[5].swa);
    CHECK(m->layers[0].rope_base == 10000.0f && m->layers[5].rope_base == m->hp.rope_base);
    CHECK(fabsf(m->hp.embd_scale - sqrtf(128.0f)) < 1e-5f && fabsf(m->hp.attn_scale - 0.125f) < 1e-7f);
    CHECK(m->layers[2].q_norm && m->layers[2].k_norm && m->layers[2].post_attn_norm && m->layers[2].post_ffn_norm);
    kv_model_free(m);

    REQUIRE(make("qwen2", pa, NULL) == 0);
    REQUIRE((m = kv_model_load(pa, NULL, &err)));
    CHECK(m->hp.qkv_bias && m->layers[3].bq && m->layers[3].bk && m->layers[3].bv && !m->layers[3].q_norm);
    kv_model_free(m);

    REQUIRE(make("qwen3", pa, NULL) == 0);
    REQUIRE((m = kv_model_load(pa, NULL, &err)));
    CHECK(m->hp.qk_norm && m->layers[1].q_norm && !m->layers[1].bq && !m->hp.n_swa);
    kv_model_free(m);

    REQUIRE(make("phi3", pa, NULL) == 0);
    REQUIRE((m = kv_model_load(pa, NULL, &err)));
    const kv_layer *L = &m->layers[0];
    /* the fused views: Q, K, V one after the other in attn_qkv, gate then up in ffn_up */
    CHECK(L->wq.ne1 == 128 && L->wk.ne1 == 64 && L->wv.ne1 == 64);
    CHECK((const char *)L->wk.data == (const char *)L->wq.data + 128 * L->wq.nb1);
    CHECK((const char *)L->wv.data == (const char *)L->wk.data + 64 * L->wk.nb1);
    CHECK((const char *)L->w_up.data == (const char *)L->w_gate.data + 256 * L->w_gate.nb1);
    kv_model_free(m);

    REQUIRE(make("llama", pa, llama3_shape) == 0);
    REQUIRE((m = kv_model_load(pa, NULL, &err)));
    CHECK(m->rope_freqs && m->rope_freqs[0] == 1.0f && m->rope_freqs[m->hp.rot_dim / 2 - 1] == 8.0f);
    CHECK(m->hp.n_expert == 0 && !m->expert_views);
    kv_model_free(m);

    REQUIRE(make("qwen3moe", pa, moe_shape) == 0);
    REQUIRE((m = kv_model_load(pa, NULL, &err)));
    CHECK(m->hp.n_expert == 8 && m->hp.n_expert_used == 2 && m->hp.expert_ffn_dim == 64 && m->hp.expert_norm);
    CHECK(m->hp.qk_norm && m->layers[0].q_norm && m->layers[5].router.ne1 == 8 && m->layers[5].router.ne0 == 128);
    L = &m->layers[4];
    /* per-expert views: expert e's rows follow expert e - 1's in the 3-D tensor */
    CHECK(L->exp_gate[0].ne0 == 128 && L->exp_gate[0].ne1 == 64 && L->exp_down[7].ne0 == 64 &&
          L->exp_down[7].ne1 == 128);
    CHECK((const char *)L->exp_up[3].data == (const char *)L->exp_up[2].data + 64 * L->exp_up[2].nb1);
    CHECK((const char *)L->exp_down[7].data == (const char *)L->exp_down[0].data + 7 * 128 * L->exp_down[0].nb1);
    char desc[256];
    kv_arch_describe(m, desc, sizeof desc);
    CHECKF(strstr(desc, "8 experts, 2 used per token, expert FFN 64"), "describe: %s", desc);
    kv_model_free(m);

    /* Mixtral-style llama: the expert width is feed_forward_length */
    REQUIRE(make("llama", pa, moe_shape) == 0);
    REQUIRE((m = kv_model_load(pa, NULL, &err)));
    CHECK(m->hp.n_expert == 8 && m->hp.expert_ffn_dim == 64 && m->layers[1].exp_gate && !m->layers[1].q_norm);
    kv_model_free(m);
    unlink(pa);
}

/* The routing the engine reports adds up: over a run, every computed
 * token is routed to experts_used experts in every layer; each step
 * record's figures agree with the snapshot's per-expert row. */
static void test_moe_routing_counts(void) {
    const char *pa = tmp("route");
    REQUIRE(make("qwen3moe", pa, moe_shape) == 0);
    kv_config c;
    kv_config_default(&c);
    snprintf(c.model.path, sizeof c.model.path, "%s", pa);
    c.threads = 1;
    c.sampling.temperature = 0;
    kv_err err;
    kv_engine *e = kv_engine_new(&c, &err);
    REQUIRE(e);
    uint64_t tot[KV_MOE_MAX_EXPERTS];
    double imb = -1;
    CHECK(kv_engine_expert_tokens(e, tot, KV_MOE_MAX_EXPERTS, &imb) == 8 && imb == 0.0);
    int32_t prompt[3][9] = {{1, 5, 6, 7, 8, 9, 10, 11, 12}, {1, 40, 41, 42, 43, 44, 45, 46, 47}, {1, 90, 91, 92, 93}};
    const int np[3] = {9, 9, 5}, gen = 6;
    for (int i = 0; i < 3; i++) {
        kv_request_params p;
        kv_engine_request_defaults(e, &p);
        p.tokens = prompt[i];
        p.n_tokens = np[i];
        p.max_tokens = gen;
        p.ignore_eos = 1;
        REQUIRE(kv_engine_submit(e, &p, &err) > 0);
    }
    kv_engine_run_until_idle(e);
    REQUIRE(kv_engine_expert_tokens(e, tot, KV_MOE_MAX_EXPERTS, &imb) == 8);
    uint64_t sum = 0;
    for (int i = 0; i < 8; i++) sum += tot[i];
    /* computed tokens: the prompts, then each generated token but the last is fed back */
    const uint64_t computed = 9 + 9 + 5 + 3 * (gen - 1);
    CHECKF(sum == computed * 2 * 6, "routed %llu, expected %llu tokens x 2 experts x 6 layers",
           (unsigned long long)sum, (unsigned long long)(computed * 12));
    CHECKF(imb >= 1.0 && imb <= 8.0, "step imbalance %g", imb);
    kv_snapshot *sn = kv_snapshot_new();
    REQUIRE(sn && kv_engine_snapshot(e, sn) == 0);
    CHECK(sn->n_experts == 8 && sn->n_steps > 0);
    const kv_step_record *r = &sn->steps[sn->n_steps - 1];
    uint32_t rmax = 0, rsum = 0;
    int active = 0;
    for (int i = 0; i < 8; i++) {
        rsum += sn->expert_tokens[i];
        rmax = sn->expert_tokens[i] > rmax ? sn->expert_tokens[i] : rmax;
        active += sn->expert_tokens[i] > 0;
    }
    CHECK(r->n_experts == 8 && r->expert_routed == (int)rsum && r->expert_max == (int)rmax &&
          r->expert_active == active);
    CHECKF(r->expert_routed == r->n_decode_tokens * 2 * 6 + r->n_prefill_tokens * 2 * 6, "last step routed %d",
           r->expert_routed);
    kv_engine_metrics_reset(e);
    CHECK(kv_engine_expert_tokens(e, tot, KV_MOE_MAX_EXPERTS, &imb) == 8 && tot[3] == 0 && imb == 0.0);
    kv_snapshot_free(sn);
    kv_engine_free(e);
    unlink(pa);
}

/* A backend whose table lacks an MoE op is refused for a
 * qwen3moe model by kv_forward_new, naming the op; a dense model still
 * runs on it. */
static void test_moe_missing_op(void) {
    const char *pa = tmp("noop"), *pd = tmp("dense");
    REQUIRE(make("qwen3moe", pa, moe_shape) == 0 && make("qwen3", pd, NULL) == 0);
    kv_err err;
    kv_model *m = kv_model_load(pa, NULL, &err), *md = kv_model_load(pd, NULL, &err);
    kv_backend *b = kv_backend_create("cpu", 1, &err);
    REQUIRE(m && md && b);
    const kv_backend_ops *orig = b->ops;
    static const char *const names[] = {"moe_route", "scatter_add"};
    for (int i = 0; i < 2; i++) {
        kv_backend_ops o = *orig;
        if (i == 0) o.moe_route = NULL;
        else o.scatter_add = NULL;
        b->ops = &o;
        kv_err_clear(&err);
        kv_forward *f = kv_forward_new(m, b, 8, 8, &err);
        CHECKF(!f && strstr(err.msg, names[i]), "without %s: %s", names[i], f ? "accepted" : err.msg);
        kv_forward_free(f);
        f = kv_forward_new(md, b, 8, 8, &err);
        CHECKF(f != NULL, "dense model without %s: %s", names[i], err.msg);
        kv_forward_free(f);
        b->ops = orig;
    }
    kv_backend_free(b);
    kv_model_free(m);
    kv_model_free(md);
    unlink(pa);
    unlink(pd);
}

/* Rewrites src to dst without tensor `drop` (NULL: none) and with the u32
 * key `key` set to val (NULL: none), or the string key skey set to sval. */
typedef struct rewrite {
    const char *drop, *key, *skey, *sval;
    uint32_t val;
    const char *reshape; /* a 3-D tensor written with ne[2] = ne2 (its first ne2 planes) */
    int64_t ne2;
} rewrite;

static int skip_key(const char *key, void *ctx) {
    const rewrite *r = ctx;
    return (r->key && !strcmp(key, r->key)) || (r->skey && !strcmp(key, r->skey));
}

static int rewrite_file(const char *src, const char *dst, const rewrite *r) {
    kv_err err;
    kv_gguf *g = kv_gguf_open(src, &err);
    if (!g) return -1;
    kv_gguf_writer *w = kv_gguf_writer_new();
    kv_gguf_writer_copy_kv(w, g, skip_key, (void *)r);
    if (r->key) kv_gguf_writer_add_u32(w, r->key, r->val);
    if (r->skey) kv_gguf_writer_add_str(w, r->skey, r->sval);
    for (int64_t i = 0; i < kv_gguf_n_tensors(g); i++) {
        const kv_gguf_tensor *t = kv_gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
        if (r->drop && !strcmp(name, r->drop)) continue;
        int64_t ne[KV_GGUF_MAX_DIMS];
        memcpy(ne, t->ne, sizeof ne);
        uint64_t size = t->size;
        if (r->reshape && !strcmp(name, r->reshape) && t->n_dims == 3) {
            size = size / (uint64_t)ne[2] * (uint64_t)r->ne2;
            ne[2] = r->ne2;
        }
        kv_gguf_writer_add_tensor_ref(w, name, t->type, t->n_dims, ne, t->data, size);
    }
    int rc = kv_gguf_writer_write(w, dst, &err);
    kv_gguf_writer_free(w);
    kv_gguf_close(g);
    return rc;
}

/* The loader and the engine both refuse dst with a message holding want. */
static void expect_refused(const char *what, const char *path, const char *want) {
    kv_err err;
    kv_err_clear(&err);
    kv_model *m = kv_model_load(path, NULL, &err);
    if (!want) { /* a consistent change: it loads */
        CHECKF(m, "%s: %s", what, err.msg);
        kv_model_free(m);
        return;
    }
    CHECKF(!m && strstr(err.msg, want), "%s: loaded, or the message '%s' does not name '%s'", what, err.msg, want);
    kv_model_free(m);
    kv_config c;
    kv_config_default(&c);
    snprintf(c.model.path, sizeof c.model.path, "%s", path);
    c.threads = 1;
    kv_err_clear(&err);
    kv_engine *e = kv_engine_new(&c, &err);
    CHECKF(!e && strstr(err.msg, want), "%s: engine started, or '%s' does not name '%s'", what, err.msg, want);
    kv_engine_free(e);
}

static void test_bad_files(void) {
    const char *src = tmp("src"), *dst = tmp("dst");
    static const struct {
        const char *arch;
        void (*mut)(kv_mkmodel_params *);
        rewrite r;
        const char *want;
    } cases[] = {
        {"gemma3", gemma_shape, {.drop = "blk.0.attn_q_norm.weight"}, "blk.0.attn_q_norm.weight"},
        {"gemma3", gemma_shape, {.drop = "blk.4.post_ffw_norm.weight"}, "blk.4.post_ffw_norm.weight"},
        {"qwen3", NULL, {.drop = "blk.2.attn_k_norm.weight"}, "blk.2.attn_k_norm.weight"},
        {"qwen2", NULL, {.drop = "blk.1.attn_v.bias"}, "blk.1.attn_v.bias"},
        {"phi3", NULL, {.drop = "blk.3.attn_qkv.weight"}, "blk.3.attn_qkv.weight"},
        /* one K/V head fewer than the tensors were made for: shapes no longer fit */
        {"phi3", NULL, {.key = "phi3.attention.head_count_kv", .val = 1}, "blk.0.attn_qkv.weight"},
        {"qwen2", NULL, {.key = "qwen2.attention.head_count_kv", .val = 1}, "blk.0.attn_k.weight"},
        {"gemma3", gemma_shape, {.key = "gemma3.attention.key_length", .val = 48}, "rope.dimension_count"},
        {"gemma3", gemma_shape, {.key = "gemma3.rope.dimension_count", .val = 32}, NULL},
        /* heads not dividing the width; a window larger than the context */
        {"qwen3", NULL, {.key = "qwen3.attention.head_count", .val = 3}, "head_count"},
        {"gemma3", gemma_shape, {.key = "gemma3.attention.sliding_window", .val = 4096},
         "gemma3.attention.sliding_window"},
        {"gemma3", gemma_shape, {.key = "gemma3.attention.sliding_window_pattern", .val = 0},
         "sliding_window_pattern"},
        {"llama", NULL, {.skey = "llama.rope.scaling.type", .sval = "yarn"}, "llama.rope.scaling.type"},
        /* a block count no file of this size could hold: refused before the layer table is sized by it
         * (the fuzzer's 0x4000001 layers asked for 30 GiB) */
        {"qwen3moe", moe_shape, {.key = "qwen3moe.block_count", .val = 0x4000001}, "block_count"},
        {"llama", NULL, {.key = "llama.block_count", .val = 1000}, "block_count"},
        /* mixture of experts: counts out of range, tensors that do not fit them */
        {"qwen3moe", moe_shape, {.key = "qwen3moe.expert_count", .val = 0}, "qwen3moe.expert_count"},
        {"qwen3moe", moe_shape, {.key = "qwen3moe.expert_count", .val = 100000}, "qwen3moe.expert_count"},
        {"qwen3moe", moe_shape, {.key = "qwen3moe.expert_used_count", .val = 9}, "qwen3moe.expert_used_count"},
        {"qwen3moe", moe_shape, {.key = "qwen3moe.expert_used_count", .val = 0}, "qwen3moe.expert_used_count"},
        {"qwen3moe", moe_shape, {.key = "qwen3moe.expert_count", .val = 4}, "blk.0.ffn_gate_inp.weight"},
        {"qwen3moe", moe_shape, {.key = "qwen3moe.expert_feed_forward_length", .val = 96},
         "blk.0.ffn_gate_exps.weight"},
        {"qwen3moe", moe_shape, {.reshape = "blk.3.ffn_up_exps.weight", .ne2 = 7}, "blk.3.ffn_up_exps.weight"},
        {"qwen3moe", moe_shape, {.drop = "blk.2.ffn_down_exps.weight"}, "blk.2.ffn_down_exps.weight"},
        {"qwen3moe", moe_shape, {.drop = "blk.5.ffn_gate_inp.weight"}, "blk.5.ffn_gate_inp.weight"},
        {"llama", moe_shape, {.key = "llama.expert_used_count", .val = 12}, "llama.expert_used_count"},
        {"llama", moe_shape, {.reshape = "blk.0.ffn_gate_exps.weight", .ne2 = 2}, "blk.0.ffn_gate_exps.weight"},
    };
    for (size_t i = 0; i < KV_ARRAY_LEN(cases); i++) {
        if (make(cases[i].arch, src, cases[i].mut) || rewrite_file(src, dst, &cases[i].r)) {
            CHECKF(0, "case %zu: cannot write the file", i);
            continue;
        }
        char what[96];
        snprintf(what, sizeof what, "%s, case %zu", cases[i].arch, i);
        expect_refused(what, dst, cases[i].want);
    }
    unlink(src);
    unlink(dst);
}

/* mkmodel refuses what it cannot write, naming the parameter. */
static void test_mkmodel_params(void) {
    kv_mkmodel_params p = kv_mkmodel_default_params();
    kv_err err;
    p.arch = "mamba";
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "mamba"));
    p.arch = "gemma3";
    p.n_swa = p.ctx_len + 1;
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "window"));
    p.n_swa = 0;
    p.head_dim = 7;
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "head-dim"));
    p.head_dim = 0;
    p.n_experts = 4; /* gemma3 has no experts */
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "experts"));
    p.arch = "qwen3moe";
    p.n_experts_used = 5;
    CHECK(kv_mkmodel_validate(&p, &err) == KV_ERR_INVAL && strstr(err.msg, "experts-used"));
    p.n_experts_used = 4;
    CHECK(kv_mkmodel_validate(&p, &err) == 0);
}

TEST_MAIN(T(test_load_each), T(test_moe_routing_counts), T(test_moe_missing_op), T(test_bad_files), T(test_mkmodel_params))
