/* synthetic.c - the synthetic models: the table of published shapes, the
 * weight formats, a model made of hyper-parameters alone, and its made-up
 * tokenizer. The step-time model that replaces the forward pass is in
 * synth_step.c. */
#include "synthetic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gguf.h"
#include "tokenizer.h"

/* Shapes from each model's published config.json on the Hugging Face hub
 * (num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads,
 * intermediate_size, vocab_size, max_position_embeddings; MoE:
 * num_local_experts / num_experts, num_experts_per_tok). */
static const kv_synth_shape shapes[] = {
    {"llama-2-7b", "Meta Llama 2 7B", 32, 4096, 32, 32, 128, 11008, 32000, 4096, 1, 1, 0,
     "meta-llama/Llama-2-7b-hf config.json"},
    {"llama-2-13b", "Meta Llama 2 13B", 40, 5120, 40, 40, 128, 13824, 32000, 4096, 1, 1, 0,
     "meta-llama/Llama-2-13b-hf config.json"},
    {"llama-2-70b", "Meta Llama 2 70B", 80, 8192, 64, 8, 128, 28672, 32000, 4096, 1, 1, 0,
     "meta-llama/Llama-2-70b-hf config.json"},
    {"llama-3-8b", "Meta Llama 3 8B", 32, 4096, 32, 8, 128, 14336, 128256, 8192, 1, 1, 0,
     "meta-llama/Meta-Llama-3-8B config.json"},
    {"llama-3.1-8b", "Meta Llama 3.1 8B (128K context)", 32, 4096, 32, 8, 128, 14336, 128256, 131072, 1, 1, 0,
     "meta-llama/Llama-3.1-8B config.json"},
    {"llama-3-70b", "Meta Llama 3 70B", 80, 8192, 64, 8, 128, 28672, 128256, 8192, 1, 1, 0,
     "meta-llama/Meta-Llama-3-70B config.json"},
    {"llama-3.1-70b", "Meta Llama 3.1 70B (128K context)", 80, 8192, 64, 8, 128, 28672, 128256, 131072, 1, 1, 0,
     "meta-llama/Llama-3.1-70B config.json"},
    {"mistral-7b", "Mistral 7B v0.1", 32, 4096, 32, 8, 128, 14336, 32000, 32768, 1, 1, 0,
     "mistralai/Mistral-7B-v0.1 config.json"},
    {"mixtral-8x7b", "Mixtral 8x7B", 32, 4096, 32, 8, 128, 14336, 32000, 32768, 8, 2, 0,
     "mistralai/Mixtral-8x7B-v0.1 config.json (8 experts, top-2)"},
    {"qwen3-30b-a3b", "Qwen3 30B-A3B", 48, 2048, 32, 4, 128, 768, 151936, 40960, 128, 8, 0,
     "Qwen/Qwen3-30B-A3B config.json (128 experts of moe_intermediate_size 768, top-8, head_dim 128)"},
    {"smollm2-135m", "SmolLM2 135M", 30, 576, 9, 3, 64, 1536, 49152, 8192, 1, 1, 1,
     "HuggingFaceTB/SmolLM2-135M config.json (tied embeddings)"},
    {"stories-110m", "TinyStories 110M (llama2.c)", 12, 768, 12, 12, 64, 2048, 32000, 1024, 1, 1, 0,
     "karpathy/tinyllamas stories110M (llama2.c README)"},
    {"stories-260k", "TinyStories 260K (llama2.c)", 5, 64, 8, 4, 8, 172, 512, 512, 1, 1, 0,
     "karpathy/tinyllamas stories260K; the shape of ../shared/models/stories260K.gguf"},
};

const kv_synth_shape *kv_synth_shapes(int *count) {
    if (count) *count = (int)KV_ARRAY_LEN(shapes);
    return shapes;
}

const kv_synth_shape *kv_synth_shape_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < KV_ARRAY_LEN(shapes); i++)
        if (!strcasecmp(name, shapes[i].name)) return &shapes[i];
    return NULL;
}

/* ---- weight formats ------------------------------------------------------ */

static const struct {
    const char *name;
    double bytes;   /* per element; 0: the kv_type's row size */
    kv_type type;   /* for bytes == 0 */
} dtypes[KV_SYNTH_DTYPE_COUNT] = {
    [KV_SYNTH_FP16] = {"fp16", 2.0, KV_TYPE_F16},
    [KV_SYNTH_BF16] = {"bf16", 2.0, KV_TYPE_BF16},
    [KV_SYNTH_FP8] = {"fp8", 1.0, KV_TYPE_F16},
    [KV_SYNTH_INT8] = {"int8", 1.0, KV_TYPE_F16},
    /* 4 bits and one f16 scale per group of 128 */
    [KV_SYNTH_INT4] = {"int4", 0.5 + 2.0 / 128.0, KV_TYPE_F16},
    [KV_SYNTH_F32] = {"f32", 0.0, KV_TYPE_F32},
    [KV_SYNTH_Q8_0] = {"q8_0", 0.0, KV_TYPE_Q8_0},
    [KV_SYNTH_Q4_0] = {"q4_0", 0.0, KV_TYPE_Q4_0},
};

int kv_synth_dtype_from_name(const char *s, kv_synth_dtype *out) {
    if (!s || !out) return KV_ERR_INVAL;
    if (!strcasecmp(s, "f16") || !strcasecmp(s, "float16")) s = "fp16";
    for (int i = 0; i < KV_SYNTH_DTYPE_COUNT; i++)
        if (!strcasecmp(s, dtypes[i].name)) {
            *out = (kv_synth_dtype)i;
            return 0;
        }
    return KV_ERR_INVAL;
}

const char *kv_synth_dtype_name(kv_synth_dtype d) {
    return (int)d >= 0 && d < KV_SYNTH_DTYPE_COUNT ? dtypes[d].name : "?";
}

double kv_synth_row_bytes(kv_synth_dtype d, int64_t n) {
    if ((int)d < 0 || d >= KV_SYNTH_DTYPE_COUNT) return 0.0;
    return dtypes[d].bytes > 0 ? dtypes[d].bytes * (double)n : (double)kv_type_row_size(dtypes[d].type, n);
}

/* ---- the shape a profile asks for ---------------------------------------- */

static void known_shapes(char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = 0;
    for (size_t i = 0; i < KV_ARRAY_LEN(shapes) && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", shapes[i].name);
}

int kv_synth_shape_resolve(const kv_config *cfg, kv_synth_shape *out, kv_err *err) {
    if (!cfg || !out) return kv_err_set(err, KV_ERR_INVAL, "synthetic: bad arguments");
    const char *name = cfg->sim.synthetic;
    kv_synth_shape s = {.name = "custom", .label = "custom shape", .n_experts = 1, .n_experts_used = 1,
                        .source = "the profile's model.* shape keys"};
    if (strcasecmp(name, "custom") != 0) {
        const kv_synth_shape *t = kv_synth_shape_find(name);
        if (!t) {
            char known[512];
            known_shapes(known, sizeof known);
            return kv_err_set(err, KV_ERR_INVAL, "model.synthetic: unknown shape '%s' (known: %s, custom)", name,
                              known);
        }
        s = *t;
    }
    const struct {
        int *dst;
        int v;
    } ov[] = {{&s.n_layers, cfg->sim.layers},   {&s.dim, cfg->sim.dim},           {&s.n_heads, cfg->sim.heads},
              {&s.n_kv_heads, cfg->sim.kv_heads}, {&s.head_dim, cfg->sim.head_dim}, {&s.ffn_dim, cfg->sim.ffn_dim},
              {&s.n_vocab, cfg->sim.vocab},      {&s.ctx_len, cfg->sim.context},   {&s.n_experts, cfg->sim.experts},
              {&s.n_experts_used, cfg->sim.experts_used}};
    for (size_t i = 0; i < KV_ARRAY_LEN(ov); i++)
        if (ov[i].v > 0) *ov[i].dst = ov[i].v;
    if (s.head_dim <= 0 && s.n_heads > 0) s.head_dim = s.dim / s.n_heads;
    if (s.n_kv_heads <= 0) s.n_kv_heads = s.n_heads;
    const char *bad = NULL;
    if (s.n_layers <= 0) bad = "model.layers must be > 0";
    else if (s.dim <= 0) bad = "model.dim must be > 0";
    else if (s.n_heads <= 0) bad = "model.heads must be > 0";
    else if (s.head_dim <= 0 || s.head_dim % 2) bad = "model.head_dim must be a positive even number";
    else if (s.n_heads % s.n_kv_heads) bad = "model.kv_heads must divide model.heads";
    else if (s.ffn_dim <= 0) bad = "model.ffn_dim must be > 0";
    else if (s.n_vocab < 260) bad = "model.vocab must be >= 260 (3 specials and 256 byte tokens come first)";
    else if (s.ctx_len <= 0) bad = "model.context must be > 0";
    else if (s.n_experts_used > s.n_experts) bad = "model.experts_used must be <= model.experts";
    if (bad) return kv_err_set(err, KV_ERR_INVAL, "model.synthetic %s: %s", name, bad);
    *out = s;
    return 0;
}

/* ---- the made-up tokenizer ----------------------------------------------- */

/* A little-endian GGUF v3 buffer of metadata only (no tensors). */
typedef struct gbuf {
    uint8_t *p;
    size_t len, cap;
    int oom;
} gbuf;

static void gput(gbuf *b, const void *src, size_t n) {
    if (b->oom) return;
    if (b->len + n > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        while (nc < b->len + n) nc *= 2;
        uint8_t *q = realloc(b->p, nc);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}
static void gu32(gbuf *b, uint32_t v) { gput(b, &v, 4); }
static void gu64(gbuf *b, uint64_t v) { gput(b, &v, 8); }
static void gstr(gbuf *b, const char *s) {
    gu64(b, strlen(s));
    gput(b, s, strlen(s));
}
static void gkey(gbuf *b, const char *key, kv_gguf_vtype t) {
    gstr(b, key);
    gu32(b, (uint32_t)t);
}

/* Ids: 0 <unk>, 1 <s>, 2 </s>, 3..258 the bytes <0x00>..<0xFF>, then
 * filler words "▁w<id>" with falling scores. Text encodes byte by byte
 * (no filler word occurs in workload text), so a prompt's ids follow from
 * its bytes and identical prefixes give identical ids. */
static kv_tokenizer *make_tokenizer(int n_vocab, kv_err *err) {
    gbuf b = {0};
    gput(&b, "GGUF", 4);
    gu32(&b, 3);
    gu64(&b, 0); /* tensors */
    gu64(&b, 7); /* keys */
    gkey(&b, "tokenizer.ggml.model", KV_GGUF_STRING);
    gstr(&b, "llama");
    gkey(&b, "tokenizer.ggml.tokens", KV_GGUF_ARRAY);
    gu32(&b, KV_GGUF_STRING);
    gu64(&b, (uint64_t)n_vocab);
    char piece[32];
    for (int i = 0; i < n_vocab; i++) {
        if (i == 0) snprintf(piece, sizeof piece, "<unk>");
        else if (i == 1) snprintf(piece, sizeof piece, "<s>");
        else if (i == 2) snprintf(piece, sizeof piece, "</s>");
        else if (i < 259) snprintf(piece, sizeof piece, "<0x%02X>", i - 3);
        else snprintf(piece, sizeof piece, "\xe2\x96\x81w%d", i);
        gstr(&b, piece);
    }
    gkey(&b, "tokenizer.ggml.scores", KV_GGUF_ARRAY);
    gu32(&b, KV_GGUF_FLOAT32);
    gu64(&b, (uint64_t)n_vocab);
    for (int i = 0; i < n_vocab; i++) {
        float sc = i < 259 ? 0.0f : -(float)i;
        gput(&b, &sc, 4);
    }
    gkey(&b, "tokenizer.ggml.token_type", KV_GGUF_ARRAY);
    gu32(&b, KV_GGUF_INT32);
    gu64(&b, (uint64_t)n_vocab);
    for (int i = 0; i < n_vocab; i++) {
        int32_t ty = i == 0 ? KV_TOKEN_UNKNOWN : i < 3 ? KV_TOKEN_CONTROL : i < 259 ? KV_TOKEN_BYTE : KV_TOKEN_NORMAL;
        gput(&b, &ty, 4);
    }
    const char *ids[] = {"tokenizer.ggml.unknown_token_id", "tokenizer.ggml.bos_token_id",
                         "tokenizer.ggml.eos_token_id"};
    for (uint32_t i = 0; i < 3; i++) {
        gkey(&b, ids[i], KV_GGUF_UINT32);
        gu32(&b, i);
    }
    kv_tokenizer *t = NULL;
    if (b.oom) {
        kv_err_set(err, KV_ERR_NOMEM, "synthetic: out of memory for a %d-token vocabulary", n_vocab);
    } else {
        kv_gguf *g = kv_gguf_open_mem(b.p, b.len, err);
        if (g) t = kv_tokenizer_from_gguf(g, err);
        kv_gguf_close(g);
    }
    free(b.p);
    return t;
}

/* ---- the model ----------------------------------------------------------- */

kv_model *kv_synth_model_new(const kv_config *cfg, kv_err *err) {
    kv_synth_shape s;
    if (kv_synth_shape_resolve(cfg, &s, err)) return NULL;
    kv_synth_dtype dt;
    if (kv_synth_dtype_from_name(cfg->sim.dtype, &dt)) {
        kv_err_set(err, KV_ERR_INVAL, "model.dtype: unknown weight format '%s' (fp16, bf16, fp8, int8, int4, f32, "
                   "q8_0, q4_0)", cfg->sim.dtype);
        return NULL;
    }
    kv_model *m = calloc(1, sizeof *m);
    if (!m) {
        kv_err_set(err, KV_ERR_NOMEM, "synthetic: out of memory");
        return NULL;
    }
    kv_hparams *hp = &m->hp;
    snprintf(hp->arch, sizeof hp->arch, "%s", "llama");
    hp->n_vocab = s.n_vocab;
    hp->dim = s.dim;
    hp->n_layers = s.n_layers;
    hp->n_heads = s.n_heads;
    hp->n_kv_heads = s.n_kv_heads;
    hp->head_dim = s.head_dim;
    hp->ffn_dim = s.ffn_dim;
    hp->ctx_len = s.ctx_len;
    hp->rot_dim = s.head_dim;
    hp->rope_base = 10000.0f;
    hp->rms_eps = 1e-5f;
    hp->tied_output = s.tied;
    m->synthetic = 1;
    m->n_experts = s.n_experts;
    m->n_experts_used = s.n_experts_used;
    m->weight_dtype = (int)dt;
    snprintf(m->name, sizeof m->name, "%s (synthetic, %s)", s.name, kv_synth_dtype_name(dt));
    snprintf(m->path, sizeof m->path, "synthetic:%s", s.name);
    snprintf(m->format, sizeof m->format, "%s", "synthetic");
    /* parameters and bytes as stored: matmul weights in dt, norms in f32 */
    double qd = (double)s.n_heads * s.head_dim, kvd = (double)s.n_kv_heads * s.head_dim, d = s.dim;
    double attn = d * qd * 2 + d * kvd * 2;
    double ffn = 3.0 * d * s.ffn_dim * s.n_experts + (s.n_experts > 1 ? d * s.n_experts : 0.0);
    double embd = (double)s.n_vocab * d * (s.tied ? 1 : 2);
    double params = s.n_layers * (attn + ffn + 2 * d) + embd + d;
    double bytes = s.n_layers * (kv_synth_row_bytes(dt, s.dim) * (qd + 2 * kvd) +
                                 kv_synth_row_bytes(dt, (int64_t)qd) * d +
                                 (kv_synth_row_bytes(dt, s.dim) * 2.0 * s.ffn_dim +
                                  kv_synth_row_bytes(dt, s.ffn_dim) * d) * s.n_experts +
                                 (s.n_experts > 1 ? 2.0 * d * s.n_experts : 0.0) + 8.0 * d) +
                   kv_synth_row_bytes(dt, s.dim) * (double)s.n_vocab * (s.tied ? 1 : 2) + 4.0 * d;
    m->n_params = (uint64_t)params;
    m->weight_bytes = (uint64_t)bytes;
    m->tok = make_tokenizer(s.n_vocab, err);
    if (!m->tok) {
        kv_model_free(m);
        return NULL;
    }
    return m;
}

int32_t kv_synth_token(const kv_model *m, uint64_t seed, int64_t request, int pos) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull ^ (uint64_t)request * 0xBF58476D1CE4E5B9ull ^ (uint64_t)pos;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    int n = m ? m->hp.n_vocab - 259 : 1;
    return 259 + (int32_t)(z % (uint64_t)(n > 0 ? n : 1));
}
