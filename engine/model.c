/* model.c - loads llama-architecture models from GGUF (weights stay in the
 * read-only mapping) or from llama2.c checkpoints (legacy fp32 format with a
 * separate tokenizer file), validating every shape and type first. */
#include "model.h"
#include "model_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int own_floats(kv_model *m, float *p) {
    float **n = realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *n);
    if (!n) return -1;
    m->owned = n;
    m->owned[m->n_owned++] = p;
    return 0;
}

static void count_tensor(kv_model *m, kv_type t, uint64_t bytes, uint64_t elems) {
    if ((int)t >= 0 && t < KV_TYPE_COUNT) m->type_counts[t]++;
    m->weight_bytes += bytes;
    m->n_params += elems;
}

/* ---------------------------------------------------------------- GGUF -- */

/* Reads an unsigned hyper-parameter "<arch>.<suffix>"; required ones must be
 * present and positive. Returns 0, or an error with err filled. */
int kv_model_hp_u32(const kv_gguf *g, const char *arch, const char *suffix, int required, uint32_t def, int *out,
                    const char *path, kv_err *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v = def;
    int rc = kv_gguf_get_u32(g, key, &v, err);
    if (rc < 0) return rc;
    if (rc == 1 && required)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: missing required metadata key '%s'", path, key);
    if (v > (uint32_t)INT32_MAX / 4)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: metadata '%s' = %u is out of range", path, key, v);
    *out = (int)v;
    return 0;
}

int kv_model_hp_f32(const kv_gguf *g, const char *arch, const char *suffix, float *out, kv_err *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = kv_gguf_get_f32(g, key, out, err);
    return rc < 0 ? rc : 0;
}

int kv_model_bind_matrix(kv_model *m, const char *name, int64_t ne0, int64_t ne1, int optional, kv_tensor *out,
                         kv_err *err) {
    const kv_gguf_tensor *t = kv_gguf_find_tensor(m->gguf, name);
    if (!t) {
        if (optional) return 1;
        return kv_err_set(err, KV_ERR_FORMAT, "%s: missing tensor '%s'", m->path, name);
    }
    if (t->n_dims > 2 || t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1)
        return kv_err_set(err, KV_ERR_FORMAT,
                          "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                          m->path, name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                          (long long)t->ne[3], (long long)ne0, (long long)ne1);
    return kv_model_bind_tensor_rows(m, t, ne0, ne1, out, err);
}

int kv_model_bind_tensor_rows(kv_model *m, const kv_gguf_tensor *t, int64_t ne0, int64_t ne1, kv_tensor *out,
                              kv_err *err) {
    const kv_type_traits *tr = kv_type_get(t->type);
    if (!tr || !tr->supported)
        return kv_err_set(err, KV_ERR_UNSUPPORTED,
                          "%s: tensor '%.*s' has type %s (id %d), which kvtop cannot compute with "
                          "(supported: f32, f16, bf16, q8_0, q4_0, q4_1 and the types `kvtop quantize` lists)",
                          m->path, (int)KV_MIN(t->name.len, 96), t->name.data, kv_type_name(t->type), (int)t->type);
    out->type = t->type;
    out->ne0 = ne0;
    out->ne1 = ne1;
    out->nb1 = kv_type_row_size(t->type, ne0);
    out->data = t->data;
    out->dev = NULL;
    count_tensor(m, t->type, t->size, (uint64_t)ne0 * (uint64_t)ne1);
    return 0;
}

int kv_model_bind_vector(kv_model *m, const char *name, int64_t n, int optional, const float **out, kv_err *err) {
    const kv_gguf_tensor *t = kv_gguf_find_tensor(m->gguf, name);
    if (!t && optional) return 1;
    if (!t) return kv_err_set(err, KV_ERR_FORMAT, "%s: missing tensor '%s'", m->path, name);
    if (t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld], expected [%lld]",
                          m->path, name, (long long)t->ne[0], (long long)t->ne[1], (long long)n);
    count_tensor(m, t->type, t->size, (uint64_t)n);
    if (t->type == KV_TYPE_F32 && ((uintptr_t)t->data % sizeof(float)) == 0) {
        *out = t->data;
        return 0;
    }
    float *buf = malloc((size_t)n * sizeof(float));
    if (!buf || own_floats(m, buf) != 0) {
        free(buf);
        return kv_err_set(err, KV_ERR_NOMEM, "out of memory converting '%s'", name);
    }
    if (kv_dequantize_row(t->type, t->data, buf, n) != 0)
        return kv_err_set(err, KV_ERR_UNSUPPORTED, "%s: tensor '%s' has unsupported type %s", m->path, name,
                          kv_type_name(t->type));
    *out = buf;
    return 0;
}

static int load_gguf(kv_model *m, kv_err *err) {
    kv_gguf *g = m->gguf;
    kv_gguf_str s;
    int rc = kv_gguf_get_str(g, "general.architecture", &s, err);
    if (rc < 0) return rc;
    if (rc == 1) return kv_err_set(err, KV_ERR_FORMAT, "%s: missing 'general.architecture'", m->path);
    const int arch = kv_arch_find(s);
    if (arch < 0)
        return kv_err_set(err, KV_ERR_UNSUPPORTED, "%s: architecture '%.*s' is not supported (supported: %s)",
                          m->path, (int)KV_MIN(s.len, 64), s.data, kv_arch_list());
    kv_hparams *hp = &m->hp;
    hp->arch_id = (kv_arch)arch;
    snprintf(hp->arch, sizeof hp->arch, "%s", kv_arch_name(hp->arch_id));
    kv_arch_defaults(hp);
    const char *a = hp->arch;
    if ((rc = kv_model_hp_u32(g, a, "embedding_length", 1, 0, &hp->dim, m->path, err)) ||
        (rc = kv_model_hp_u32(g, a, "block_count", 1, 0, &hp->n_layers, m->path, err)) ||
        (rc = kv_model_hp_u32(g, a, "feed_forward_length", 1, 0, &hp->ffn_dim, m->path, err)) ||
        (rc = kv_model_hp_u32(g, a, "attention.head_count", 1, 0, &hp->n_heads, m->path, err)) ||
        (rc = kv_model_hp_u32(g, a, "context_length", 0, 2048, &hp->ctx_len, m->path, err)))
        return rc;
    if ((rc = kv_model_hp_u32(g, a, "attention.head_count_kv", 0, (uint32_t)hp->n_heads, &hp->n_kv_heads, m->path, err)))
        return rc;
    if (hp->dim <= 0 || hp->n_layers <= 0 || hp->ffn_dim <= 0 || hp->n_heads <= 0 || hp->n_kv_heads <= 0 ||
        hp->ctx_len <= 0)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: hyper-parameters must be positive", m->path);
    /* Every layer has tensors of its own, so a block_count above the file's
     * tensor count is a lie; checked before anything is sized by it. */
    if (hp->n_layers > kv_gguf_n_tensors(g))
        return kv_err_set(err, KV_ERR_FORMAT, "%s: block_count %d is more than the file's %lld tensors", m->path,
                          hp->n_layers, (long long)kv_gguf_n_tensors(g));
    if (hp->dim % hp->n_heads)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: embedding_length %d is not a multiple of head_count %d", m->path,
                          hp->dim, hp->n_heads);
    if (hp->n_heads % hp->n_kv_heads)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: head_count %d is not a multiple of head_count_kv %d", m->path,
                          hp->n_heads, hp->n_kv_heads);
    if ((rc = kv_model_hp_u32(g, a, "attention.key_length", 0, (uint32_t)(hp->dim / hp->n_heads), &hp->head_dim, m->path,
                     err)))
        return rc;
    if (hp->head_dim <= 0 || hp->head_dim % 2)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: head size %d must be even and positive", m->path, hp->head_dim);
    if ((rc = kv_model_hp_u32(g, a, "rope.dimension_count", 0, (uint32_t)hp->head_dim, &hp->rot_dim, m->path, err)))
        return rc;
    if (hp->rot_dim <= 0 || hp->rot_dim > hp->head_dim || hp->rot_dim % 2)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: rope.dimension_count %d must be even and <= head size %d",
                          m->path, hp->rot_dim, hp->head_dim);
    char key[128];
    hp->rope_base = 10000.0f;
    snprintf(key, sizeof key, "%s.rope.freq_base", a);
    if ((rc = kv_gguf_get_f32(g, key, &hp->rope_base, err)) < 0) return rc;
    hp->rms_eps = 1e-5f;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", a);
    if ((rc = kv_gguf_get_f32(g, key, &hp->rms_eps, err)) < 0) return rc;
    if (!(hp->rope_base > 0) || !(hp->rms_eps > 0) || !(hp->rms_eps < 1))
        return kv_err_set(err, KV_ERR_FORMAT, "%s: rope.freq_base and layer_norm_rms_epsilon must be positive",
                          m->path);

    const kv_gguf_tensor *te = kv_gguf_find_tensor(g, "token_embd.weight");
    if (!te) return kv_err_set(err, KV_ERR_FORMAT, "%s: missing tensor 'token_embd.weight'", m->path);
    if (te->ne[1] <= 0 || te->ne[1] > INT32_MAX)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: bad vocabulary size in token_embd.weight", m->path);
    hp->n_vocab = (int)te->ne[1];

    if ((rc = kv_model_bind_matrix(m, "token_embd.weight", hp->dim, hp->n_vocab, 0, &m->tok_embd, err))) return rc;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    if ((rc = kv_arch_load_hparams(m, err)) || (rc = kv_arch_bind_tensors(m, err))) return rc;

    m->tok = kv_tokenizer_from_gguf(g, err);
    if (!m->tok) return err && err->code ? err->code : KV_ERR_FORMAT;
    if (kv_tokenizer_n_vocab(m->tok) > hp->n_vocab)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: tokenizer has %d tokens but the embedding only %d rows", m->path,
                          kv_tokenizer_n_vocab(m->tok), hp->n_vocab);
    if (kv_gguf_get_str(g, "tokenizer.chat_template", &s, NULL) == 0 && s.len > 0) {
        m->chat_template = malloc(s.len + 1);
        if (!m->chat_template) return kv_err_set(err, KV_ERR_NOMEM, "out of memory");
        memcpy(m->chat_template, s.data, s.len);
        m->chat_template[s.len] = '\0';
    }
    if (kv_gguf_get_str(g, "general.name", &s, NULL) == 0 && s.len > 0)
        snprintf(m->name, sizeof m->name, "%.*s", (int)KV_MIN(s.len, 120), s.data);
    snprintf(m->format, sizeof m->format, "gguf");
    m->gguf_version = kv_gguf_version(g);
    return 0;
}

/* ------------------------------------------------------------- llama2.c -- */

/* llama2.c "legacy" checkpoint: 7 int32 header (dim, hidden_dim, n_layers,
 * n_heads, n_kv_heads, vocab_size (negative: separate classifier), seq_len)
 * then fp32 weights in a fixed order, with the RoPE tables between the final
 * norm and the optional classifier. */
static int load_llama2c(kv_model *m, const char *tok_path, kv_err *err) {
    int fd = open(m->path, O_RDONLY);
    if (fd < 0) return kv_err_set(err, KV_ERR_IO, "%s: %s", m->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return kv_err_set(err, KV_ERR_IO, "%s: %s", m->path, strerror(errno));
    }
    size_t size = (size_t)st.st_size;
    if (size < 28) {
        close(fd);
        return kv_err_set(err, KV_ERR_FORMAT, "%s: not a GGUF or llama2.c file (no GGUF magic, and %zu bytes are too "
                          "few for a llama2.c header)", m->path, size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return kv_err_set(err, KV_ERR_IO, "%s: mmap: %s", m->path, strerror(errno));
    m->map = map;
    m->map_size = size;
    int32_t h[7];
    memcpy(h, map, sizeof h);
    kv_hparams *hp = &m->hp;
    snprintf(hp->arch, sizeof hp->arch, "llama");
    hp->dim = h[0];
    hp->ffn_dim = h[1];
    hp->n_layers = h[2];
    hp->n_heads = h[3];
    hp->n_kv_heads = h[4];
    hp->tied_output = h[5] > 0;
    hp->n_vocab = h[5] < 0 ? -(int64_t)h[5] > INT32_MAX ? 0 : -h[5] : h[5];
    hp->ctx_len = h[6];
    if (hp->dim <= 0 || hp->ffn_dim <= 0 || hp->n_layers <= 0 || hp->n_heads <= 0 || hp->n_kv_heads <= 0 ||
        hp->n_vocab <= 0 || hp->ctx_len <= 0 || hp->dim > 65536 || hp->ffn_dim > 1 << 20 || hp->n_layers > 4096 ||
        hp->n_vocab > 1 << 24 || hp->ctx_len > 1 << 24)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: not a GGUF or llama2.c file (no GGUF magic; read as a llama2.c "
                          "header it is out of range: dim %d, hidden %d, layers %d, heads %d, kv heads %d, vocab %d, "
                          "seq_len %d)", m->path, h[0], h[1], h[2], h[3], h[4],
                          h[5], h[6]);
    if (hp->dim % hp->n_heads || hp->n_heads % hp->n_kv_heads || (hp->dim / hp->n_heads) % 2)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: heads %d / kv heads %d do not divide dim %d", m->path,
                          hp->n_heads, hp->n_kv_heads, hp->dim);
    hp->head_dim = hp->dim / hp->n_heads;
    hp->rot_dim = hp->head_dim;
    hp->rope_base = 10000.0f;
    hp->rope_neox = 0;
    hp->rms_eps = 1e-5f;
    hp->arch_id = KV_ARCH_LLAMA;
    kv_arch_defaults(hp);
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);

    uint64_t dim = (uint64_t)hp->dim, L = (uint64_t)hp->n_layers, V = (uint64_t)hp->n_vocab;
    uint64_t kvd = (uint64_t)hp->n_kv_heads * (uint64_t)hp->head_dim, ffn = (uint64_t)hp->ffn_dim;
    uint64_t hs = (uint64_t)hp->head_dim, seq = (uint64_t)hp->ctx_len;
    /* float counts of each section in file order */
    uint64_t need = V * dim + L * dim + L * dim * dim + 2 * L * dim * kvd + L * dim * dim + L * dim +
                    2 * L * dim * ffn + L * ffn * dim + dim + seq * hs / 2 * 2 + (hp->tied_output ? 0 : V * dim);
    if (need > (size_t)-1 / 4 || 28 + need * 4 > size)
        return kv_err_set(err, KV_ERR_FORMAT, "%s: truncated llama2.c checkpoint: header needs %llu bytes, file has "
                          "%zu", m->path, (unsigned long long)(28 + need * 4), size);
    const float *p = (const float *)((const char *)map + 28);
#define TAKE(dst, count) (dst = p, p += (count))
    const float *emb, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final, *wcls = NULL;
    TAKE(emb, V * dim);
    TAKE(rms_att, L * dim);
    TAKE(wq, L * dim * dim);
    TAKE(wk, L * dim * kvd);
    TAKE(wv, L * dim * kvd);
    TAKE(wo, L * dim * dim);
    TAKE(rms_ffn, L * dim);
    TAKE(w1, L * dim * ffn);
    TAKE(w2, L * ffn * dim);
    TAKE(w3, L * dim * ffn);
    TAKE(rms_final, dim);
    p += seq * hs / 2 * 2; /* freq_cis_real, freq_cis_imag: recomputed by rope */
    if (!hp->tied_output) TAKE(wcls, V * dim);
#undef TAKE
    m->layers = calloc((size_t)L, sizeof *m->layers);
    if (!m->layers) return kv_err_set(err, KV_ERR_NOMEM, "out of memory");
#define MAT(t, ptr, rows, cols) \
    ((t).type = KV_TYPE_F32, (t).ne0 = (int64_t)(cols), (t).ne1 = (int64_t)(rows), (t).nb1 = (size_t)(cols) * 4, \
     (t).data = (ptr), (t).dev = NULL, count_tensor(m, KV_TYPE_F32, (uint64_t)(rows) * (cols) * 4, (uint64_t)(rows) * (cols)))
    MAT(m->tok_embd, emb, V, dim);
    for (uint64_t l = 0; l < L; l++) {
        kv_layer *y = &m->layers[l];
        y->attn_norm = rms_att + l * dim;
        y->ffn_norm = rms_ffn + l * dim;
        y->rope_base = hp->rope_base;
        count_tensor(m, KV_TYPE_F32, dim * 8, dim * 2);
        MAT(y->wq, wq + l * dim * dim, dim, dim);
        MAT(y->wk, wk + l * dim * kvd, kvd, dim);
        MAT(y->wv, wv + l * dim * kvd, kvd, dim);
        MAT(y->wo, wo + l * dim * dim, dim, dim);
        MAT(y->w_gate, w1 + l * dim * ffn, ffn, dim);
        MAT(y->w_down, w2 + l * ffn * dim, dim, ffn);
        MAT(y->w_up, w3 + l * dim * ffn, ffn, dim);
    }
    m->output_norm = rms_final;
    count_tensor(m, KV_TYPE_F32, dim * 4, dim);
    if (wcls) {
        MAT(m->output, wcls, V, dim);
    } else {
        m->output = m->tok_embd;
    }
#undef MAT
    if (!tok_path || !*tok_path)
        return kv_err_set(err, KV_ERR_INVAL, "%s: a llama2.c checkpoint needs its tokenizer file (--tokenizer)",
                          m->path);
    if (kv_model_probe_file(tok_path, NULL, err)) return err ? err->code : KV_ERR_IO;
    m->tok = kv_tokenizer_from_llama2c(tok_path, hp->n_vocab, err);
    if (!m->tok) return err && err->code ? err->code : KV_ERR_FORMAT;
    snprintf(m->format, sizeof m->format, "llama2c");
    return 0;
}

/* Counts the non-finite values of a norm vector; the first one's index
 * goes to *first (when none was found before). */
static int count_nonfinite(const float *v, int n, int *first) {
    int bad = 0;
    for (int i = 0; v && i < n; i++)
        if (!isfinite(v[i])) {
            if (!bad && *first < 0) *first = i;
            bad++;
        }
    return bad;
}

/* NaN or Inf in a norm weight poisons every output: the file loads (its
 * other tensors may be what someone is looking at), with a warning the
 * front ends print, and the engine ends requests whose logits are not
 * finite (step.c). */
static void check_norms(kv_model *m) {
    const int dim = m->hp.dim;
    int total = 0, at = -1;
    char where[64] = "";
    for (int l = 0; l < m->hp.n_layers; l++) {
        const float *v[2] = {m->layers[l].attn_norm, m->layers[l].ffn_norm};
        static const char *names[2] = {"attn_norm", "ffn_norm"};
        for (int k = 0; k < 2; k++) {
            int first = -1, n = count_nonfinite(v[k], dim, &first);
            if (n && !where[0]) snprintf(where, sizeof where, "blk.%d.%s.weight", l, names[k]), at = first;
            total += n;
        }
    }
    int first = -1, n = count_nonfinite(m->output_norm, dim, &first);
    if (n && !where[0]) snprintf(where, sizeof where, "output_norm.weight"), at = first;
    total += n;
    if (total)
        snprintf(m->warning, sizeof m->warning,
                 "%.120s: %d non-finite value%s (NaN or Inf) in the norm weights, first %s[%d]: outputs will not "
                 "be finite; generation stops with an error",
                 m->path, total, total == 1 ? "" : "s", where, at);
}

const char *kv_model_warning(const kv_model *m) { return m ? m->warning : ""; }

int kv_model_probe_file(const char *path, int *gguf, kv_err *err) {
    struct stat st;
    if (stat(path, &st) != 0) return kv_err_set(err, KV_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return kv_err_set(err, KV_ERR_IO, "%s: is a directory, not a model file", path);
    if (!S_ISREG(st.st_mode))
        return kv_err_set(err, KV_ERR_IO, "%s: not a regular file (a pipe, device or socket); give a model file",
                          path);
    if (st.st_size == 0) return kv_err_set(err, KV_ERR_FORMAT, "%s: empty file, not a GGUF or llama2.c model", path);
    FILE *f = fopen(path, "rb");
    if (!f) return kv_err_set(err, KV_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char magic[4] = {0};
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    if (gguf) *gguf = n == 4 && memcmp(magic, "GGUF", 4) == 0;
    return 0;
}

kv_model *kv_model_load(const char *path, const char *tokenizer_path, kv_err *err) {
    if (!path || !*path) {
        kv_err_set(err, KV_ERR_INVAL, "no model path given");
        return NULL;
    }
    int gguf = 0;
    if (kv_model_probe_file(path, &gguf, err) != 0) return NULL;
    kv_model *m = calloc(1, sizeof *m);
    if (!m) {
        kv_err_set(err, KV_ERR_NOMEM, "out of memory");
        return NULL;
    }
    snprintf(m->path, sizeof m->path, "%s", path);
    const char *base = strrchr(path, '/');
    snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : path);
    int rc;
    if (gguf) {
        m->gguf = kv_gguf_open(path, err);
        rc = m->gguf ? load_gguf(m, err) : (err && err->code ? err->code : KV_ERR_FORMAT);
    } else {
        rc = load_llama2c(m, tokenizer_path, err);
    }
    if (rc != 0) {
        if (err && !err->code) kv_err_set(err, rc, "%s: failed to load", path);
        kv_model_free(m);
        return NULL;
    }
    check_norms(m);
    return m;
}

int kv_model_prepare_weights(const kv_model *m, kv_backend *be) {
    if (!m || !be || !be->ops->prepare_weight || m->synthetic || !m->layers) return 0;
    int failed = 0;
    kv_err err;
#define PREP(t) failed += (t)->data && be->ops->prepare_weight(be, (t), &err) != KV_OK
    for (int l = 0; l < m->hp.n_layers; l++) {
        const kv_layer *L = &m->layers[l];
        PREP(&L->wq);
        PREP(&L->wk);
        PREP(&L->wv);
        PREP(&L->wo);
        if (m->hp.n_expert > 0) {
            for (int x = 0; x < m->hp.n_expert; x++) {
                if (L->exp_gate) PREP(&L->exp_gate[x]);
                if (L->exp_up) PREP(&L->exp_up[x]);
                if (L->exp_down) PREP(&L->exp_down[x]);
            }
        } else {
            PREP(&L->w_gate);
            PREP(&L->w_up);
            PREP(&L->w_down);
        }
    }
    PREP(&m->output);
#undef PREP
    return failed;
}

void kv_model_free(kv_model *m) {
    if (!m) return;
    kv_tokenizer_free(m->tok);
    free(m->chat_template);
    free(m->layers);
    free(m->expert_views);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    kv_gguf_close(m->gguf);
    if (m->map) munmap(m->map, m->map_size);
    free(m);
}

uint64_t kv_model_kv_bytes_per_token(const kv_model *m, kv_cache_dtype dtype) {
    return 2ull * (uint64_t)m->hp.n_layers * (uint64_t)m->hp.n_kv_heads *
           (uint64_t)kv_cache_row_bytes(dtype, m->hp.head_dim);
}
