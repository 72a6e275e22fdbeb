/* mkmodel.c - random-weight models as GGUF (llama, qwen2, qwen3, gemma3,
 * phi3): llama.cpp's tensor names and shapes, <arch>.* metadata, a synthetic SentencePiece-style vocabulary,
 * and weights produced row by row at write time (seeded per tensor and row,
 * quantized with kv_quantize_row), so a 110M model takes seconds and little
 * memory and the same seed always gives the same bytes; and a model's first
 * layers as a smaller model of the same vocabulary (a draft). */
#include "mkmodel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "../base/hash.h"
#include "gguf.h"
#include "model.h" /* KV_MOE_MAX_EXPERTS */

#define MK_MIN_VOCAB 259 /* <unk>, <s>, </s> and the 256 byte tokens */
#define MK_MAX_VOCAB (1 << 21)
#define MK_MAX_DIM 65536
#define MK_MAX_LAYERS 1024
#define MK_MAX_FFN (1 << 20)
#define MK_MAX_CTX (1 << 24)
#define MK_PIECE_BYTES 16 /* longest synthetic piece is 7 bytes + NUL */
#define MK_FILLS_PER_LAYER 16 /* random tensors a layer has at most (gemma3: 11) */

/* Standard deviation of the weights: GPT-2's 0.02, with the projections
 * that write into the residual stream (attn_output, ffn_down) scaled by
 * 1/sqrt(2 * n_layers) so the stream grows slowly with depth and deep random
 * models keep finite activations. Values are uniform with that deviation. */
#define MK_STD 0.02f
#define MK_ROUTER_STD 0.1f /* logits of spread ~ 0.1 sqrt(dim): a clear top-k */

kv_mkmodel_params kv_mkmodel_default_params(void) {
    kv_mkmodel_params p;
    memset(&p, 0, sizeof p);
    p.dim = 128;
    p.n_layers = 4;
    p.n_heads = 4;
    p.n_kv_heads = 2;
    p.ffn_dim = 384;
    p.n_vocab = 512;
    p.ctx_len = 2048;
    p.type = KV_TYPE_F32;
    p.untied = 0;
    p.seed = 42;
    p.rope_base = 10000.0f;
    p.rms_eps = 1e-5f;
    return p;
}

int kv_mkmodel_file_type(kv_type t) {
    switch (t) {
    case KV_TYPE_F32: return 0;  /* LLAMA_FTYPE_ALL_F32 */
    case KV_TYPE_F16: return 1;  /* MOSTLY_F16 */
    case KV_TYPE_Q4_0: return 2; /* MOSTLY_Q4_0 */
    case KV_TYPE_Q4_1: return 3; /* MOSTLY_Q4_1 */
    case KV_TYPE_Q8_0: return 7; /* MOSTLY_Q8_0 */
    case KV_TYPE_Q5_0: return 8;
    case KV_TYPE_Q5_1: return 9;
    case KV_TYPE_Q2_K: return 10;
    case KV_TYPE_Q3_K: return 11; /* Q3_K_S */
    case KV_TYPE_Q4_K: return 14; /* Q4_K_S */
    case KV_TYPE_Q5_K: return 16; /* Q5_K_S */
    case KV_TYPE_Q6_K: return 18;
    case KV_TYPE_BF16: return 32; /* MOSTLY_BF16 */
    default: return -1;
    }
}

/* The architecture mkmodel writes: index into mk_archs, or -1. */
static const char *const mk_archs[] = {"llama", "qwen2", "qwen3", "gemma3", "phi3", "qwen3moe"};
enum { MK_LLAMA, MK_QWEN2, MK_QWEN3, MK_GEMMA3, MK_PHI3, MK_QWEN3MOE };
static int mk_arch_id(const char *a) {
    if (!a) return MK_LLAMA;
    for (int i = 0; i < (int)KV_ARRAY_LEN(mk_archs); i++)
        if (!strcmp(a, mk_archs[i])) return i;
    return -1;
}

/* The experts a file of p has (0: dense) and how many a token uses. */
static int mk_experts(const kv_mkmodel_params *p) {
    return p->n_experts ? p->n_experts : mk_arch_id(p->arch) == MK_QWEN3MOE ? 8 : 0;
}
static int mk_experts_used(const kv_mkmodel_params *p) {
    return mk_experts(p) == 0 ? 0 : p->n_experts_used ? p->n_experts_used : KV_MIN(2, mk_experts(p));
}

/* 1 when kv_quantize_row can produce t (tried on one zero block). */
static int type_writable(kv_type t) {
    const kv_type_traits *tr = kv_type_get((int)t);
    if (!tr || tr->blck_size > 256 || tr->type_size > 1024) return 0;
    float zeros[256] = {0};
    unsigned char out[1024];
    return kv_quantize_row(t, zeros, out, tr->blck_size) == 0;
}

int kv_mkmodel_validate(const kv_mkmodel_params *p, kv_err *err) {
    if (!p) return kv_err_set(err, KV_ERR_INVAL, "mkmodel: NULL parameters");
#define RANGE(field, lo, hi, what)                                                                     \
    if (p->field < (lo) || p->field > (hi))                                                            \
        return kv_err_set(err, KV_ERR_INVAL, "mkmodel: %s %d is out of range [%d, %d]", what, p->field, \
                          (int)(lo), (int)(hi));
    RANGE(dim, 2, MK_MAX_DIM, "dim")
    RANGE(n_layers, 1, MK_MAX_LAYERS, "layers")
    RANGE(n_heads, 1, p->dim, "heads")
    RANGE(n_kv_heads, 1, p->n_heads, "kv-heads")
    RANGE(ffn_dim, 1, MK_MAX_FFN, "ffn")
    RANGE(ctx_len, 1, MK_MAX_CTX, "ctx")
    if (!p->vocab_from) RANGE(n_vocab, MK_MIN_VOCAB, MK_MAX_VOCAB, "vocab")
#undef RANGE
    if (mk_arch_id(p->arch) < 0)
        return kv_err_set(err, KV_ERR_INVAL, "mkmodel: unknown arch '%s' (llama, qwen2, qwen3, gemma3, phi3, qwen3moe)",
                          p->arch);
    const int arch = mk_arch_id(p->arch);
    if (p->n_experts < 0 || p->n_experts > KV_MOE_MAX_EXPERTS || (p->n_experts && arch != MK_LLAMA &&
                                                                  arch != MK_QWEN3MOE))
        return kv_err_set(err, KV_ERR_INVAL, "mkmodel: experts %d must be in [0, %d] (llama or qwen3moe only)",
                          p->n_experts, KV_MOE_MAX_EXPERTS);
    if (p->n_experts_used < 0 || p->n_experts_used > mk_experts(p))
        return kv_err_set(err, KV_ERR_INVAL, "mkmodel: experts-used %d must be in [1, experts %d]",
                          p->n_experts_used, mk_experts(p));
    if (p->head_dim < 0 || p->head_dim > 4096 || p->head_dim % 2)
        return kv_err_set(err, KV_ERR_INVAL, "mkmodel: head-dim %d must be even and in [0, 4096]", p->head_dim);
    if (p->n_swa < 0 || p->n_swa > p->ctx_len)
        return kv_err_set(err, KV_ERR_INVAL, "mkmodel: window %d must be in [0, ctx %d]", p->n_swa, p->ctx_len);
    if (p->dim % p->n_heads)
        return kv_err_set(err, KV_ERR_INVAL, "mkmodel: heads %d does not divide dim %d", p->n_heads, p->dim);
    if (p->rope_freqs && (p->head_dim ? p->head_dim : p->dim / p->n_heads) > 4096)
        return kv_err_set(err, KV_ERR_INVAL, "mkmodel: --rope-freqs needs a head size of at most 4096");
    if (!p->head_dim && (p->dim / p->n_heads) % 2)
        return kv_err_set(err, KV_ERR_INVAL, "mkmodel: head size %d (dim %d / heads %d) must be even for RoPE",
                          p->dim / p->n_heads, p->dim, p->n_heads);
    if (p->head_dim && (p->head_dim * p->n_heads) % kv_type_get((int)p->type)->blck_size)
        return kv_err_set(err, KV_ERR_INVAL, "mkmodel: heads x head-dim %d must be a multiple of %s's block",
                          p->head_dim * p->n_heads, kv_type_name((int)p->type));
    if (p->n_heads % p->n_kv_heads)
        return kv_err_set(err, KV_ERR_INVAL, "mkmodel: kv-heads %d does not divide heads %d", p->n_kv_heads,
                          p->n_heads);
    if (!(p->rope_base > 0.0f) || !isfinite(p->rope_base))
        return kv_err_set(err, KV_ERR_INVAL, "mkmodel: rope base %g must be positive", p->rope_base);
    if (!(p->rms_eps > 0.0f && p->rms_eps < 1.0f))
        return kv_err_set(err, KV_ERR_INVAL, "mkmodel: rms epsilon %g must be in (0, 1)", p->rms_eps);
    const kv_type_traits *tr = kv_type_get((int)p->type);
    if (!tr || kv_mkmodel_file_type(p->type) < 0 || !type_writable(p->type))
        return kv_err_set(err, KV_ERR_INVAL, "mkmodel: weight type %s (%d) cannot be written (no quantizer)",
                          kv_type_name((int)p->type), (int)p->type);
    if (p->dim % tr->blck_size || p->ffn_dim % tr->blck_size)
        return kv_err_set(err, KV_ERR_INVAL, "mkmodel: %s needs dim (%d) and ffn (%d) to be multiples of %d",
                          tr->name, p->dim, p->ffn_dim, tr->blck_size);
    return 0;
}

uint64_t kv_mkmodel_n_params(const kv_mkmodel_params *p) {
    if (kv_mkmodel_validate(p, NULL)) return 0;
    uint64_t d = (uint64_t)p->dim, f = (uint64_t)p->ffn_dim, v = (uint64_t)p->n_vocab;
    uint64_t hd = p->head_dim ? (uint64_t)p->head_dim : d / (uint64_t)p->n_heads;
    uint64_t qd = hd * (uint64_t)p->n_heads, kvd = hd * (uint64_t)p->n_kv_heads;
    const uint64_t E = (uint64_t)mk_experts(p);
    uint64_t layer = 2 * d + 2 * d * qd + 2 * d * kvd + (E ? E * 3 * d * f + d * E : 3 * d * f);
    return v * d * (p->untied ? 2 : 1) + d + (uint64_t)p->n_layers * layer;
}

/* ---- deterministic random numbers ------------------------------------- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* One weight tensor's producer: rows are independent streams seeded by
 * (tensor seed, row), so the bytes do not depend on how the writer chunks
 * its calls. */
typedef struct mk_fill {
    kv_type type;
    int64_t ne0;      /* row length */
    size_t row_bytes; /* encoded row */
    uint64_t seed;    /* from the model seed and the tensor name */
    float amp;        /* uniform half-width: std * sqrt(3) */
    float center;     /* added to every value (1 for norm weights) */
    float *scratch;   /* shared, >= ne0 floats (one writer thread) */
} mk_fill;

static int mk_fill_rows(void *vctx, void *dst, int64_t row0, int64_t n_rows) {
    const mk_fill *f = vctx;
    unsigned char *out = dst;
    const float scale = f->amp * (2.0f / 16777216.0f); /* 24-bit integer -> [-amp, amp) */
    for (int64_t r = 0; r < n_rows; r++) {
        uint64_t s = f->seed ^ ((uint64_t)(row0 + r) * 0xd1342543de82ef95ull);
        splitmix64(&s);
        float *x = f->scratch;
        int64_t j = 0;
        for (; j + 1 < f->ne0; j += 2) {
            uint64_t z = splitmix64(&s);
            x[j] = (float)(int32_t)((uint32_t)z >> 8) * scale - f->amp;
            x[j + 1] = (float)(int32_t)(uint32_t)(z >> 40) * scale - f->amp;
        }
        if (j < f->ne0) x[j] = (float)(int32_t)((uint32_t)splitmix64(&s) >> 8) * scale - f->amp;
        if (f->center != 0.0f)
            for (j = 0; j < f->ne0; j++) x[j] += f->center;
        if (kv_quantize_row(f->type, x, out + (size_t)r * f->row_bytes, f->ne0)) return KV_ERR_UNSUPPORTED;
    }
    return 0;
}

/* ---- synthetic vocabulary ---------------------------------------------- */

/* Single characters that get their own piece: "▁" (U+2581, the SentencePiece
 * word-start marker), letters, digits, common punctuation. */
static const char *const mk_singles = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\"-:;()";

/* Fills tokens/scores/types for n tokens: <unk>, <s>, </s>, <0x00>..<0xFF>,
 * then "▁" and the single characters, then for L = 1, 2, ...: "▁" + every
 * L-letter lowercase word, then every (L+1)-letter word, in order, until n.
 * Every piece's prefixes come earlier, so SentencePiece-style merging can
 * reach each one; scores fall with the index so shorter pieces merge first. */
static void mk_vocab(int n, char *store, const char **tokens, float *scores, int32_t *types) {
    int k = 0;
#define PUT(str, score, type)                                        \
    do {                                                             \
        if (k >= n) return;                                          \
        snprintf(store + (size_t)k * MK_PIECE_BYTES, MK_PIECE_BYTES, "%s", str); \
        tokens[k] = store + (size_t)k * MK_PIECE_BYTES;              \
        scores[k] = (score);                                         \
        types[k] = (type);                                           \
        k++;                                                         \
    } while (0)
    PUT("<unk>", 0.0f, 2); /* unknown */
    PUT("<s>", 0.0f, 3);   /* control */
    PUT("</s>", 0.0f, 3);
    for (int b = 0; b < 256; b++) {
        char t[8];
        snprintf(t, sizeof t, "<0x%02X>", b);
        PUT(t, 0.0f, 6); /* byte */
    }
    int normal = 0;
    PUT("\xe2\x96\x81", -(float)normal++, 1);
    for (const char *c = mk_singles; *c; c++) {
        char t[2] = {*c, 0};
        PUT(t, -(float)normal++, 1);
    }
    for (int L = 1; L <= 5; L++) {
        for (int marked = 1; marked >= 0; marked--) {
            int m = marked ? L : L + 1; /* letters in the piece */
            long count = 1;
            for (int i = 0; i < m; i++) count *= 26;
            for (long idx = 0; idx < count; idx++) {
                char t[MK_PIECE_BYTES];
                int o = 0;
                if (marked) {
                    memcpy(t, "\xe2\x96\x81", 3);
                    o = 3;
                }
                long v = idx;
                for (int i = m - 1; i >= 0; i--) {
                    t[o + i] = (char)('a' + v % 26);
                    v /= 26;
                }
                t[o + m] = '\0';
                PUT(t, -(float)normal++, 1);
            }
        }
    }
#undef PUT
}

static int skip_non_tokenizer(const char *key, void *ctx) {
    (void)ctx;
    return strncmp(key, "tokenizer.", 10) != 0;
}

/* ---- the model ---------------------------------------------------------- */

/* Llama 3's RoPE frequency divisors for head size hd (out: hd / 2), as its
 * converter derives them from rope_scaling: factor 8, low_freq_factor 1,
 * high_freq_factor 4, original context 8192. Wavelengths shorter than
 * 8192 / 4 keep their frequency, longer than 8192 are divided by 8, and
 * those between blend smoothly. */
static void mk_llama3_freqs(float base, int hd, float *out) {
    const double factor = 8.0, lo = 1.0, hi = 4.0, old_ctx = 8192.0;
    for (int i = 0; i < hd / 2; i++) {
        double freq = pow((double)base, -2.0 * i / hd), wavelen = 2.0 * M_PI / freq;
        if (wavelen < old_ctx / hi) {
            out[i] = 1.0f;
        } else if (wavelen > old_ctx / lo) {
            out[i] = (float)factor;
        } else {
            double smooth = (old_ctx / wavelen - lo) / (hi - lo);
            out[i] = (float)(1.0 / ((1.0 - smooth) / factor + smooth));
        }
    }
}

/* Refuses a model larger than the free space of path's file system before a
 * byte is written (a petabyte model would otherwise fill the disk first).
 * The estimate is the weights at their type's density, norms in f32 and the
 * vocabulary; it is a floor, so only a model that cannot fit is refused. */
static int check_disk(const kv_mkmodel_params *p, const char *path, kv_err *err) {
    const kv_type_traits *tr = kv_type_get((int)p->type);
    double per_weight = (double)tr->type_size / (double)tr->blck_size;
    double need = (double)kv_mkmodel_n_params(p) * per_weight + (double)p->n_vocab * 16.0;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
    struct statvfs vs;
    if (statvfs(dir, &vs) != 0) return 0; /* cannot tell: the write reports any failure */
    double avail = (double)vs.f_bavail * (double)vs.f_frsize;
    if (need > avail)
        return kv_err_set(err, KV_ERR_IO, "mkmodel: the model needs at least %.3g GB but %s has only %.3g GB free",
                          need / 1e9, dir, avail / 1e9);
    return 0;
}

/* Adds every tensor of the model to w: weights produced at write time by
 * fills (room for MK_FILLS_PER_LAYER per layer + 4), norms all ones for
 * llama (`ones`: dim floats) and around 1 for the others, Llama 3's
 * rope_freqs table when asked for. */
static void mk_add_tensors(kv_gguf_writer *w, const kv_mkmodel_params *pp, int arch, int hd, mk_fill *fills,
                           float *scratch, const float *ones, const float *rope_freqs) {
    const kv_mkmodel_params p = *pp;
    /* tensors: ne[0] is the input (row) length, as llama.cpp stores them */
    int kvd = hd * p.n_kv_heads, qd = hd * p.n_heads, n_exp = mk_experts(&p);
    const float layer_std = MK_STD, resid_std = MK_STD / sqrtf(2.0f * (float)p.n_layers);
    int nf = 0;
    /* a 3-D expert tensor: n_exp matrices of (in, out) one after the other
     * (n_exp 1 and type f32: the router) */
#define EXPERTS(name_, type_, in, out, n_exp, std)                                                 \
    do {                                                                                           \
        mk_fill *f = &fills[nf++];                                                                 \
        int64_t ne_[3] = {(in), (out), (n_exp)};                                                   \
        f->type = (type_);                                                                         \
        f->ne0 = (in);                                                                             \
        f->row_bytes = kv_type_row_size((type_), (in));                                            \
        uint64_t s_ = p.seed ^ kv_hash_fnv1a(name_, strlen(name_));                                \
        f->seed = splitmix64(&s_);                                                                 \
        f->amp = (std) * 1.7320508f;                                                               \
        f->scratch = scratch;                                                                      \
        kv_gguf_writer_add_tensor_fn(w, name_, (type_), (n_exp) > 1 ? 3 : 2, ne_, mk_fill_rows, f); \
    } while (0)
    /* a 2-D weight matrix in the file's type */
#define WEIGHT(name_, in, out, std) EXPERTS(name_, p.type, in, out, 1, std)
    /* an f32 vector of n values around center (norm weights, biases) */
#define VECTOR(name_, n, center_, std)                                                             \
    do {                                                                                           \
        mk_fill *f = &fills[nf++];                                                                 \
        int64_t ne_[1] = {(n)};                                                                    \
        f->type = KV_TYPE_F32;                                                                     \
        f->ne0 = (n);                                                                              \
        f->row_bytes = (size_t)(n) * sizeof(float);                                                \
        uint64_t s_ = p.seed ^ kv_hash_fnv1a(name_, strlen(name_));                                \
        f->seed = splitmix64(&s_);                                                                 \
        f->amp = (std) * 1.7320508f;                                                               \
        f->center = (center_);                                                                     \
        f->scratch = scratch;                                                                      \
        kv_gguf_writer_add_tensor_fn(w, name_, KV_TYPE_F32, 1, ne_, mk_fill_rows, f);              \
    } while (0)
    /* llama keeps all-ones norms (its files stay as they were); the other
     * architectures get norms around 1 so a norm read wrongly shows */
#define NORM(name_, n)                                                                             \
    do {                                                                                           \
        if (arch == MK_LLAMA)                                                                      \
            kv_gguf_writer_add_tensor_ref(w, name_, KV_TYPE_F32, 1, (int64_t[1]){(n)}, ones,       \
                                          (size_t)(n) * sizeof(float));                            \
        else                                                                                       \
            VECTOR(name_, n, 1.0f, 0.2f);                                                          \
    } while (0)
    WEIGHT("token_embd.weight", p.dim, p.n_vocab, MK_STD);
    NORM("output_norm.weight", p.dim);
    if (p.untied) WEIGHT("output.weight", p.dim, p.n_vocab, MK_STD);
    if (p.rope_freqs) kv_gguf_writer_add_tensor_ref(w, "rope_freqs.weight", KV_TYPE_F32, 1, (int64_t[1]){hd / 2},
                                                    rope_freqs, (size_t)(hd / 2) * sizeof(float));
    for (int l = 0; l < p.n_layers; l++) {
        char nm[64];
#define NAME(suffix) (snprintf(nm, sizeof nm, "blk.%d." suffix, l), nm)
        NORM(NAME("attn_norm.weight"), p.dim);
        if (arch == MK_PHI3) {
            WEIGHT(NAME("attn_qkv.weight"), p.dim, qd + 2 * kvd, layer_std);
        } else {
            WEIGHT(NAME("attn_q.weight"), p.dim, qd, layer_std);
            WEIGHT(NAME("attn_k.weight"), p.dim, kvd, layer_std);
            WEIGHT(NAME("attn_v.weight"), p.dim, kvd, layer_std);
        }
        if (arch == MK_QWEN2) {
            VECTOR(NAME("attn_q.bias"), qd, 0.0f, 0.1f);
            VECTOR(NAME("attn_k.bias"), kvd, 0.0f, 0.1f);
            VECTOR(NAME("attn_v.bias"), kvd, 0.0f, 0.1f);
        }
        if (arch == MK_QWEN3 || arch == MK_GEMMA3 || arch == MK_QWEN3MOE) {
            NORM(NAME("attn_q_norm.weight"), hd);
            NORM(NAME("attn_k_norm.weight"), hd);
        }
        WEIGHT(NAME("attn_output.weight"), qd, p.dim, resid_std);
        if (arch == MK_GEMMA3) NORM(NAME("post_attention_norm.weight"), p.dim);
        NORM(NAME("ffn_norm.weight"), p.dim);
        if (n_exp) {
            /* the router stays f32 (llama.cpp's quantizers keep it so) and
             * is wide enough that the top-k choice is not a near-tie */
            EXPERTS(NAME("ffn_gate_inp.weight"), KV_TYPE_F32, p.dim, n_exp, 1, MK_ROUTER_STD);
            EXPERTS(NAME("ffn_gate_exps.weight"), p.type, p.dim, p.ffn_dim, n_exp, layer_std);
            EXPERTS(NAME("ffn_up_exps.weight"), p.type, p.dim, p.ffn_dim, n_exp, layer_std);
            EXPERTS(NAME("ffn_down_exps.weight"), p.type, p.ffn_dim, p.dim, n_exp, resid_std);
        } else if (arch == MK_PHI3) {
            WEIGHT(NAME("ffn_up.weight"), p.dim, 2 * p.ffn_dim, layer_std);
        } else {
            WEIGHT(NAME("ffn_gate.weight"), p.dim, p.ffn_dim, layer_std);
            WEIGHT(NAME("ffn_up.weight"), p.dim, p.ffn_dim, layer_std);
        }
        if (!n_exp) WEIGHT(NAME("ffn_down.weight"), p.ffn_dim, p.dim, resid_std);
        if (arch == MK_GEMMA3) NORM(NAME("post_ffw_norm.weight"), p.dim);
#undef NAME
    }
#undef NORM
#undef EXPERTS
#undef VECTOR
#undef WEIGHT
}

int kv_mkmodel_write(const kv_mkmodel_params *pin, const char *path, kv_err *err) {
    int rc = kv_mkmodel_validate(pin, err);
    if (rc) return rc;
    if (!path || !*path) return kv_err_set(err, KV_ERR_INVAL, "mkmodel: no output path");
    rc = check_disk(pin, path, err);
    if (rc) return rc;
    kv_mkmodel_params p = *pin;
    kv_gguf *src = NULL;
    kv_gguf_writer *w = NULL;
    char *store = NULL;
    const char **tokens = NULL;
    float *scores = NULL, *ones = NULL, *scratch = NULL;
    float rope_freqs[2048];
    int32_t *types = NULL;
    mk_fill *fills = NULL;

    if (p.vocab_from) {
        src = kv_gguf_open(p.vocab_from, err);
        if (!src) return err ? err->code : KV_ERR_IO;
        kv_gguf_vtype et;
        uint64_t n = 0;
        rc = kv_gguf_get_arr(src, "tokenizer.ggml.tokens", &et, &n, err);
        if (rc == 0 && et != KV_GGUF_STRING) rc = KV_ERR_FORMAT;
        if (rc || n < 1 || n > MK_MAX_VOCAB) {
            rc = kv_err_set(err, KV_ERR_FORMAT, "%s: no usable tokenizer.ggml.tokens (string array of 1..%d)",
                            p.vocab_from, MK_MAX_VOCAB);
            goto fail;
        }
        p.n_vocab = (int)n;
    }

    w = kv_gguf_writer_new();
    ones = malloc((size_t)p.dim * sizeof *ones);
    scratch = malloc((size_t)KV_MAX(p.dim, p.ffn_dim) * sizeof *scratch);
    fills = calloc((size_t)p.n_layers * MK_FILLS_PER_LAYER + 4, sizeof *fills);
    if (!w || !ones || !scratch || !fills) {
        rc = kv_err_set(err, KV_ERR_NOMEM, "mkmodel: out of memory");
        goto fail;
    }
    for (int i = 0; i < p.dim; i++) ones[i] = 1.0f;

    /* metadata, in the order llama.cpp's converters write it */
    const int arch = mk_arch_id(p.arch);
    const char *A = mk_archs[arch];
    int hd = p.head_dim ? p.head_dim : p.dim / p.n_heads;
    if (p.rope_freqs) mk_llama3_freqs(p.rope_base, hd, rope_freqs);
    char key[96];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, A), key)
    kv_gguf_writer_add_str(w, "general.architecture", A);
    kv_gguf_writer_add_str(w, "general.name", p.name ? p.name : "kvtop-random");
    kv_gguf_writer_add_u32(w, KEY("context_length"), (uint32_t)p.ctx_len);
    kv_gguf_writer_add_u32(w, KEY("embedding_length"), (uint32_t)p.dim);
    kv_gguf_writer_add_u32(w, KEY("block_count"), (uint32_t)p.n_layers);
    kv_gguf_writer_add_u32(w, KEY("feed_forward_length"), (uint32_t)p.ffn_dim);
    kv_gguf_writer_add_u32(w, KEY("rope.dimension_count"), (uint32_t)hd);
    kv_gguf_writer_add_u32(w, KEY("attention.head_count"), (uint32_t)p.n_heads);
    kv_gguf_writer_add_u32(w, KEY("attention.head_count_kv"), (uint32_t)p.n_kv_heads);
    if (mk_experts(&p)) {
        kv_gguf_writer_add_u32(w, KEY("expert_count"), (uint32_t)mk_experts(&p));
        kv_gguf_writer_add_u32(w, KEY("expert_used_count"), (uint32_t)mk_experts_used(&p));
        if (arch == MK_QWEN3MOE) kv_gguf_writer_add_u32(w, KEY("expert_feed_forward_length"), (uint32_t)p.ffn_dim);
    }
    if (p.head_dim || arch == MK_GEMMA3 || arch == MK_QWEN3 || arch == MK_QWEN3MOE) {
        kv_gguf_writer_add_u32(w, KEY("attention.key_length"), (uint32_t)hd);
        kv_gguf_writer_add_u32(w, KEY("attention.value_length"), (uint32_t)hd);
    }
    if (p.n_swa) kv_gguf_writer_add_u32(w, KEY("attention.sliding_window"), (uint32_t)p.n_swa);
    kv_gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), p.rms_eps);
    kv_gguf_writer_add_f32(w, KEY("rope.freq_base"), p.rope_base);
    kv_gguf_writer_add_u32(w, KEY("vocab_size"), (uint32_t)p.n_vocab);
#undef KEY
    kv_gguf_writer_add_u32(w, "general.file_type", (uint32_t)kv_mkmodel_file_type(p.type));
    kv_gguf_writer_add_u32(w, "general.quantization_version", 2);
    kv_gguf_writer_add_u64(w, "kvtop.mkmodel.seed", p.seed);

    if (src) {
        kv_gguf_writer_copy_kv(w, src, skip_non_tokenizer, NULL);
    } else {
        store = malloc((size_t)p.n_vocab * MK_PIECE_BYTES);
        tokens = malloc((size_t)p.n_vocab * sizeof *tokens);
        scores = malloc((size_t)p.n_vocab * sizeof *scores);
        types = malloc((size_t)p.n_vocab * sizeof *types);
        if (!store || !tokens || !scores || !types) {
            rc = kv_err_set(err, KV_ERR_NOMEM, "mkmodel: out of memory for a %d-token vocabulary", p.n_vocab);
            goto fail;
        }
        mk_vocab(p.n_vocab, store, tokens, scores, types);
        kv_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama");
        kv_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", tokens, NULL, (uint64_t)p.n_vocab);
        kv_gguf_writer_add_arr(w, "tokenizer.ggml.scores", KV_GGUF_FLOAT32, scores, (uint64_t)p.n_vocab);
        kv_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", KV_GGUF_INT32, types, (uint64_t)p.n_vocab);
        kv_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0);
        kv_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
        kv_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
        kv_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 1);
        kv_gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", 0);
    }

    mk_add_tensors(w, &p, arch, hd, fills, scratch, ones, rope_freqs);
    /* any add that failed above is remembered by the writer and reported here */
    rc = kv_gguf_writer_write(w, path, err);

fail:
    kv_gguf_writer_free(w);
    kv_gguf_close(src);
    free(store);
    free(tokens);
    free(scores);
    free(types);
    free(ones);
    free(scratch);
    free(fills);
    return rc;
}

/* ---- a truncated copy (a same-vocabulary draft) ------------------------- */

static int skip_one_key(const char *key, void *ctx) { return strcmp(key, (const char *)ctx) == 0; }

int kv_mkmodel_truncate(const char *src, const char *dst, int n_layers, kv_err *err) {
    if (!src || !dst) return kv_err_set(err, KV_ERR_INVAL, "truncate: NULL path");
    kv_gguf *g = kv_gguf_open(src, err);
    if (!g) return err && err->code < 0 ? err->code : KV_ERR_IO;
    kv_gguf_writer *w = NULL;
    kv_gguf_str arch;
    char key[96];
    uint32_t have = 0;
    int rc = kv_gguf_get_str(g, "general.architecture", &arch, err);
    if (rc == 1) rc = kv_err_set(err, KV_ERR_FORMAT, "%s: missing 'general.architecture'", src);
    if (rc) goto fail;
    snprintf(key, sizeof key, "%.*s.block_count", (int)KV_MIN(arch.len, 64), arch.data);
    rc = kv_gguf_get_u32(g, key, &have, err);
    if (rc == 1) rc = kv_err_set(err, KV_ERR_FORMAT, "%s: missing '%s'", src, key);
    if (rc) goto fail;
    if (n_layers < 1 || (uint32_t)n_layers > have) {
        rc = kv_err_set(err, KV_ERR_INVAL, "truncate: %d layers asked for; %s has %u", n_layers, src, have);
        goto fail;
    }
    if (!(w = kv_gguf_writer_new())) {
        rc = kv_err_set(err, KV_ERR_NOMEM, "truncate: out of memory");
        goto fail;
    }
    kv_gguf_writer_copy_kv(w, g, skip_one_key, key);
    kv_gguf_writer_add_u32(w, key, (uint32_t)n_layers);
    for (int64_t i = 0; i < kv_gguf_n_tensors(g); i++) {
        const kv_gguf_tensor *t = kv_gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
        int blk;
        if (sscanf(name, "blk.%d.", &blk) == 1 && blk >= n_layers) continue;
        kv_gguf_writer_add_tensor_ref(w, name, t->type, t->n_dims, t->ne, t->data, t->size);
    }
    /* any add that failed above is remembered by the writer and reported here */
    rc = kv_gguf_writer_write(w, dst, err);

fail:
    kv_gguf_writer_free(w);
    kv_gguf_close(g);
    return rc;
}
