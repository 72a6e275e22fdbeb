/* quantize.c - GGUF -> GGUF re-encoding with llama.cpp's per-tensor type
 * rules (see quantize.h). Converted tensors stream through the GGUF
 * writer's fill callback, a chunk of rows at a time, split across a thread
 * pool; copied tensors are borrowed from the input mapping. */
#include "quantize.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/file.h"
#include "../kernels/quant_ext.h"
#include "../kernels/threadpool.h"
#include "gguf.h"

/* llama.cpp's llama_ftype values (general.file_type). */
enum {
    FT_ALL_F32 = 0,
    FT_F16 = 1,
    FT_Q4_0 = 2,
    FT_Q4_1 = 3,
    FT_Q8_0 = 7,
    FT_Q5_0 = 8,
    FT_Q5_1 = 9,
    FT_Q4_K_S = 14,
    FT_Q4_K_M = 15,
    FT_Q5_K_S = 16,
    FT_Q5_K_M = 17,
    FT_Q6_K = 18,
    FT_BF16 = 32
};

static const struct {
    const char *name;
    const char *canon;
    kv_type base;
    uint32_t ftype;
} targets[] = {
    {"f32", "f32", KV_TYPE_F32, FT_ALL_F32},      {"f16", "f16", KV_TYPE_F16, FT_F16},
    {"bf16", "bf16", KV_TYPE_BF16, FT_BF16},      {"q8_0", "q8_0", KV_TYPE_Q8_0, FT_Q8_0},
    {"q4_0", "q4_0", KV_TYPE_Q4_0, FT_Q4_0},      {"q4_1", "q4_1", KV_TYPE_Q4_1, FT_Q4_1},
    {"q5_0", "q5_0", KV_TYPE_Q5_0, FT_Q5_0},      {"q5_1", "q5_1", KV_TYPE_Q5_1, FT_Q5_1},
    {"q4_k", "q4_k_s", KV_TYPE_Q4_K, FT_Q4_K_S},  {"q4_k_s", "q4_k_s", KV_TYPE_Q4_K, FT_Q4_K_S},
    {"q4_k_m", "q4_k_m", KV_TYPE_Q4_K, FT_Q4_K_M}, {"q5_k", "q5_k_s", KV_TYPE_Q5_K, FT_Q5_K_S},
    {"q5_k_s", "q5_k_s", KV_TYPE_Q5_K, FT_Q5_K_S}, {"q5_k_m", "q5_k_m", KV_TYPE_Q5_K, FT_Q5_K_M},
    {"q6_k", "q6_k", KV_TYPE_Q6_K, FT_Q6_K},
};

const char *kv_quant_target_names(void) {
    return "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k (q4_k_s), q4_k_m, q5_k (q5_k_s), q5_k_m, q6_k";
}

int kv_quant_target_from_name(const char *name, kv_quant_target *out, kv_err *err) {
    char low[16];
    size_t n = name ? strlen(name) : 0;
    if (n > 0 && n < sizeof low) {
        for (size_t i = 0; i <= n; i++) low[i] = (char)tolower((unsigned char)name[i]);
        for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
            if (!strcmp(low, targets[i].name)) {
                out->name = targets[i].canon;
                out->base = targets[i].base;
                out->file_type = targets[i].ftype;
                return 0;
            }
        }
    }
    return kv_err_set(err, KV_ERR_INVAL, "unknown quantization type '%s' (valid: %s)", name ? name : "(null)",
                      kv_quant_target_names());
}

/* ------------------------------------------------------------------ */
/* type rules                                                         */

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !memcmp(s + a - b, suf, b);
}

static int is_quantized(kv_type t) { return t != KV_TYPE_F32 && t != KV_TYPE_F16 && t != KV_TYPE_BF16; }

static int blck(kv_type t) { return kv_type_get(t)->blck_size; }

/* Dimensions that matter, as ggml_n_dims counts them (trailing 1s drop). */
static int eff_dims(int n_dims, const int64_t *ne) {
    int d = 1;
    for (int i = 1; i < n_dims && i < KV_GGUF_MAX_DIMS; i++)
        if (ne[i] > 1) d = i + 1;
    return d;
}

/* llama.cpp's choice of which tensors are converted at all. */
static int is_convertible(const char *name, int n_dims, const int64_t *ne) {
    if (!ends_with(name, "weight")) return 0;
    if (eff_dims(n_dims, ne) < 2) return 0;
    if (strstr(name, "_norm.weight")) return 0;
    if (strstr(name, "ffn_gate_inp.weight")) return 0; /* expert router: small, sensitive */
    if (!strcmp(name, "position_embd.weight") || !strcmp(name, "token_types.weight")) return 0;
    if (strstr(name, "ssm_conv1d.weight") || strstr(name, "attn_rel_b.weight")) return 0;
    return 1;
}

static int use_more_bits(int i_layer, int n_layers) {
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

kv_type kv_quant_tensor_type(const kv_quant_target *t, const kv_quant_model_info *mi, const char *name,
                             int n_dims, const int64_t *ne, kv_type src, int i_attn_v, int i_ffn_down,
                             int *fallback) {
    if (fallback) *fallback = 0;
    if (!is_convertible(name, n_dims, ne)) return src;
    kv_type nt = t->base;
    if (!is_quantized(nt)) return nt; /* f32 / f16 / bf16: every matrix, no mixes */
    const uint32_t ft = t->file_type;
    const int km = ft == FT_Q4_K_M || ft == FT_Q5_K_M;
    if (!strcmp(name, "output.weight") || (!mi->has_output && !strcmp(name, "token_embd.weight"))) {
        if (ne[0] % blck(nt)) nt = KV_TYPE_Q8_0;
        else if (nt != KV_TYPE_Q8_0) nt = KV_TYPE_Q6_K;
    } else if (!strcmp(name, "token_embd.weight")) {
        /* untied input embedding: the base type */
    } else if (strstr(name, "attn_v.weight")) {
        if (km && use_more_bits(i_attn_v, mi->n_attn_v)) nt = KV_TYPE_Q6_K;
        else if (ft == FT_Q4_K_S && i_attn_v < 4) nt = KV_TYPE_Q5_K;
    } else if (strstr(name, "ffn_down")) {
        if (km && use_more_bits(i_ffn_down, mi->n_layer)) nt = KV_TYPE_Q6_K;
        else if (ft == FT_Q4_K_S && i_ffn_down < mi->n_layer / 8) nt = KV_TYPE_Q5_K;
    } else if (strstr(name, "attn_qkv.weight")) {
        if (ft == FT_Q4_K_M) nt = KV_TYPE_Q5_K;
        else if (ft == FT_Q5_K_M) nt = KV_TYPE_Q6_K;
    }
    if (ne[0] % blck(nt)) {
        switch (nt) {
        case KV_TYPE_Q4_K: nt = KV_TYPE_Q5_0; break;
        case KV_TYPE_Q5_K: nt = KV_TYPE_Q5_1; break;
        case KV_TYPE_Q6_K: nt = KV_TYPE_Q8_0; break;
        default: nt = KV_TYPE_F16; break; /* NOTE: llama.cpp refuses here; F16 always fits */
        }
        if (ne[0] % blck(nt)) nt = KV_TYPE_F16;
        if (fallback) *fallback = 1;
    }
    return nt;
}

/* ------------------------------------------------------------------ */
/* row conversion                                                     */

static int is_base_convertible(kv_type t) {
    return t == KV_TYPE_F32 || t == KV_TYPE_F16 || t == KV_TYPE_BF16 || t == KV_TYPE_Q8_0 || t == KV_TYPE_Q4_0 ||
           t == KV_TYPE_Q4_1;
}
static int can_decode(kv_type t) { return kv_qext_get(t) || is_base_convertible(t); }
static int can_encode(kv_type t) { return (kv_qext_get(t) && t != KV_TYPE_Q8_K) || is_base_convertible(t); }

static int row_to_f32(kv_type t, const void *src, float *dst, int64_t n) {
    const kv_qext_ops *o = kv_qext_get(t);
    if (o) {
        o->dequantize_row(src, dst, n);
        return 0;
    }
    return kv_dequantize_row(t, src, dst, n);
}

static int row_from_f32(kv_type t, const float *src, void *dst, int64_t n) {
    const kv_qext_ops *o = kv_qext_get(t);
    if (o) {
        o->quantize_row(src, dst, n);
        return 0;
    }
    return kv_quantize_row(t, src, dst, n);
}

typedef struct qrun qrun;

/* One tensor to convert (the fill context). */
typedef struct conv_job {
    qrun *run;
    int64_t index;          /* tensor index in the file */
    const kv_gguf_tensor *src;
    char name[96];
    kv_type dst_type;
    size_t src_row, dst_row; /* bytes per row */
} conv_job;

struct qrun {
    kv_threadpool *pool;
    float *scratch;          /* (n_threads, max_ne0) */
    int64_t max_ne0;
    const kv_quantize_params *p;
    int64_t n_tensors;
    uint64_t bytes_done, bytes_total;
};

typedef struct conv_chunk {
    const conv_job *job;
    uint8_t *dst;
    int64_t row0, n_rows;
    int any_failed; /* set by any thread whose conversion failed */
} conv_chunk;

static void conv_task(void *ctx, int ith, int nth) {
    conv_chunk *c = ctx;
    const conv_job *j = c->job;
    const int64_t ne0 = j->src->ne[0];
    float *buf = j->run->scratch + (size_t)ith * (size_t)j->run->max_ne0;
    const int64_t r0 = c->n_rows * ith / nth, r1 = c->n_rows * (ith + 1) / nth;
    const uint8_t *src = (const uint8_t *)j->src->data;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t row = c->row0 + r;
        if (row_to_f32(j->src->type, src + (size_t)row * j->src_row, buf, ne0) ||
            row_from_f32(j->dst_type, buf, c->dst + (size_t)r * j->dst_row, ne0)) {
            __atomic_store_n(&c->any_failed, 1, __ATOMIC_RELAXED);
            return;
        }
    }
}

static int conv_fill(void *ctx, void *dst, int64_t row0, int64_t n_rows) {
    const conv_job *j = ctx;
    conv_chunk c;
    memset(&c, 0, sizeof c);
    c.job = j;
    c.dst = dst;
    c.row0 = row0;
    c.n_rows = n_rows;
    kv_threadpool_run(j->run->pool, conv_task, &c);
    if (c.any_failed) return KV_ERR_UNSUPPORTED;
    qrun *q = j->run;
    q->bytes_done += (uint64_t)n_rows * j->dst_row;
    if (q->p->progress)
        q->p->progress(q->p->progress_ctx, j->index, q->n_tensors, j->name, q->bytes_done, q->bytes_total);
    return 0;
}

/* ------------------------------------------------------------------ */
/* the file                                                           */

static int skip_key(const char *key, void *ctx) {
    (void)ctx;
    return !strcmp(key, "general.file_type") || !strcmp(key, "general.quantization_version") ||
           !strncmp(key, "split.", 6);
}

static int layer_of(const char *name) {
    int l = -1;
    if (sscanf(name, "blk.%d.", &l) != 1) return -1;
    return l;
}

static void tensor_name(const kv_gguf_tensor *t, char out[96]) {
    size_t n = t->name.len < 95 ? (size_t)t->name.len : 95;
    memcpy(out, t->name.data, n);
    out[n] = '\0';
}

/* Rank of tensor i among the tensors whose names contain one of pats,
 * ordered by layer then by file position (llama.cpp walks tensors sorted by
 * layer number, so its counters equal this rank). */
static int rank_among(const kv_gguf *g, int64_t i, const char *const *pats, int npat) {
    char me[96], other[96];
    tensor_name(kv_gguf_tensor_at(g, i), me);
    const int lme = layer_of(me);
    int r = 0;
    for (int64_t k = 0; k < kv_gguf_n_tensors(g); k++) {
        if (k == i) continue;
        tensor_name(kv_gguf_tensor_at(g, k), other);
        int hit = 0;
        for (int q = 0; q < npat; q++) hit |= strstr(other, pats[q]) != NULL;
        if (!hit) continue;
        const int lo = layer_of(other);
        if (lo < lme || (lo == lme && k < i)) r++;
    }
    return r;
}

int kv_quantize_file(const char *in_path, const char *out_path, const kv_quantize_params *p,
                     kv_quantize_stats *st, kv_err *err) {
    if (!in_path || !out_path || !p) return kv_err_set(err, KV_ERR_INVAL, "quantize: NULL argument");
    const kv_type_traits *btr = kv_type_get(p->target.base);
    if (!btr || !can_encode(p->target.base))
        return kv_err_set(err, KV_ERR_INVAL, "quantize: target type %s cannot be written",
                          kv_type_name(p->target.base));
    if (kv_same_file(in_path, out_path))
        return kv_err_set(err, KV_ERR_INVAL, "quantize: output %s is the input file", out_path);

    const double t0 = kv_now_s();
    kv_quantize_stats stats;
    memset(&stats, 0, sizeof stats);
    kv_gguf *g = kv_gguf_open(in_path, err);
    if (!g) return err ? err->code : KV_ERR_IO;

    int rc = 0;
    kv_gguf_writer *w = NULL;
    conv_job *jobs = NULL;
    qrun run;
    memset(&run, 0, sizeof run);
    run.p = p;
    const int64_t nt = kv_gguf_n_tensors(g);
    run.n_tensors = nt;

    /* model facts for the mixes */
    kv_quant_model_info mi = {0, 0, 0};
    int max_layer = -1;
    for (int64_t i = 0; i < nt; i++) {
        char nm[96];
        tensor_name(kv_gguf_tensor_at(g, i), nm);
        if (!strcmp(nm, "output.weight")) mi.has_output = 1;
        if (strstr(nm, "attn_v.weight") || strstr(nm, "attn_qkv.weight")) mi.n_attn_v++;
        int l = layer_of(nm);
        if (l > max_layer) max_layer = l;
    }
    mi.n_layer = max_layer + 1;
    {
        kv_gguf_str arch;
        uint32_t bc;
        char key[160];
        if (kv_gguf_get_str(g, "general.architecture", &arch, NULL) == 0 && arch.len < 100) {
            snprintf(key, sizeof key, "%.*s.block_count", (int)arch.len, arch.data);
            if (kv_gguf_get_u32(g, key, &bc, NULL) == 0 && bc > 0 && bc < (1u << 20)) mi.n_layer = (int)bc;
        }
    }

    jobs = calloc((size_t)(nt > 0 ? nt : 1), sizeof *jobs);
    w = kv_gguf_writer_new();
    if (!jobs || !w) {
        rc = kv_err_set(err, KV_ERR_NOMEM, "quantize: out of memory");
        goto fail;
    }
    /* The writer remembers its first failure, and write() reports it, so the
     * adds below need no individual checks. */
    kv_gguf_writer_set_alignment(w, (uint32_t)kv_gguf_alignment(g));
    kv_gguf_writer_copy_kv(w, g, skip_key, NULL);
    kv_gguf_writer_add_u32(w, "general.quantization_version", 2);
    kv_gguf_writer_add_u32(w, "general.file_type", p->target.file_type);

    /* plan every tensor first: a bad one fails before anything is written */
    static const char *const pat_v[] = {"attn_v.weight", "attn_qkv.weight"};
    static const char *const pat_down[] = {"ffn_down"};
    for (int64_t i = 0; i < nt; i++) {
        const kv_gguf_tensor *t = kv_gguf_tensor_at(g, i);
        conv_job *j = &jobs[i];
        j->run = &run;
        j->index = i;
        j->src = t;
        tensor_name(t, j->name);
        int fb = 0;
        const int iv = strstr(j->name, "attn_v.weight") || strstr(j->name, "attn_qkv.weight")
                           ? rank_among(g, i, pat_v, 2) : 0;
        const int id = strstr(j->name, "ffn_down") ? rank_among(g, i, pat_down, 1) : 0;
        j->dst_type = kv_quant_tensor_type(&p->target, &mi, j->name, t->n_dims, t->ne, t->type, iv, id, &fb);
        stats.n_fallback += fb;
        stats.bytes_in += t->size;
        if (p->on_tensor) p->on_tensor(p->progress_ctx, j->name, t->type, j->dst_type, fb, t->n_dims, t->ne);
        if (j->dst_type == t->type) {
            stats.n_copied++;
            stats.bytes_out += t->size;
            continue;
        }
        if (!can_decode(t->type)) {
            rc = kv_err_set(err, KV_ERR_UNSUPPORTED, "%s: tensor '%s' is %s, which kvtop cannot dequantize",
                            in_path, j->name, kv_type_name(t->type));
            goto fail;
        }
        j->src_row = kv_type_row_size(t->type, t->ne[0]);
        j->dst_row = kv_type_row_size(j->dst_type, t->ne[0]);
        const uint64_t rows = (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
        stats.n_converted++;
        stats.bytes_out += rows * j->dst_row;
        run.bytes_total += rows * j->dst_row;
        if (t->ne[0] > run.max_ne0) run.max_ne0 = t->ne[0];
    }

    for (int64_t i = 0; i < nt; i++) {
        const conv_job *j = &jobs[i];
        const kv_gguf_tensor *t = j->src;
        if (j->dst_type == t->type)
            kv_gguf_writer_add_tensor_ref(w, j->name, t->type, t->n_dims, t->ne, t->data, t->size);
        else
            kv_gguf_writer_add_tensor_fn(w, j->name, j->dst_type, t->n_dims, t->ne, conv_fill, (void *)j);
    }

    if (run.max_ne0 > 0) {
        int n_threads = p->n_threads;
        if (n_threads != 1) {
            run.pool = kv_threadpool_new(n_threads);
            if (!run.pool) {
                rc = kv_err_set(err, KV_ERR_NOMEM, "quantize: cannot start %d threads", n_threads);
                goto fail;
            }
        }
        const size_t nth = (size_t)kv_threadpool_size(run.pool);
        run.scratch = malloc(nth * (size_t)run.max_ne0 * sizeof(float));
        if (!run.scratch) {
            rc = kv_err_set(err, KV_ERR_NOMEM, "quantize: out of memory for %zu row buffers of %lld floats", nth,
                            (long long)run.max_ne0);
            goto fail;
        }
    }
    rc = kv_gguf_writer_write(w, out_path, err);
    if (rc) goto fail;
    stats.n_tensors = nt;
    stats.seconds = kv_now_s() - t0;
    if (st) *st = stats;

fail:
    kv_threadpool_free(run.pool);
    free(run.scratch);
    kv_gguf_writer_free(w);
    free(jobs);
    kv_gguf_close(g);
    return rc;
}
