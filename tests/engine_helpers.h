/* engine_helpers.h - what the engine-level tests (tests/engine, tests/gpu)
 * share: a configuration on a test model, an engine made from it with the
 * reason printed when it cannot be, a tokenizer read from a GGUF file, and
 * the shape of a tiny random model for kv_mkmodel. Header-only, after
 * harness.h. */
#ifndef KV_TEST_ENGINE_HELPERS_H
#define KV_TEST_ENGINE_HELPERS_H

#include <stdio.h>

#include "../engine/engine.h"
#include "../engine/gguf.h"
#include "../engine/mkmodel.h"
#include "../engine/tokenizer.h"
#include "harness.h"

/* SmolLM2-135M-Instruct where `make models` puts it (the tests run from the
 * repository root). */
#define TEST_SMOLLM2 "models/SmolLM2-135M-Instruct.Q4_1.gguf"

/* kv_config's defaults on the model at `model` (NULL: stories260K of the
 * shared test data) with `threads` threads, a KV pool of `blocks` blocks
 * (0: sized from kv.memory) and at most max_seqs sequences and max_batched
 * tokens a step (0: kv_config's default). A test sets what else it needs
 * afterwards. */
static inline void test_engine_config(kv_config *c, const char *model, int threads, int blocks, int max_seqs,
                                      int max_batched) {
    kv_config_default(c);
    if (model)
        harness_copy_str(c->model.path, sizeof c->model.path, model);
    else
        harness_shared_copy(c->model.path, sizeof c->model.path, "models/stories260K.gguf");
    c->threads = threads;
    c->kv.blocks = blocks;
    c->scheduler.max_seqs = max_seqs;
    if (max_batched > 0) c->scheduler.max_batched_tokens = max_batched;
}

/* kv_engine_new(c), or NULL with the reason printed. */
static inline kv_engine *test_engine_new(const kv_config *c) {
    kv_err err;
    kv_engine *e = kv_engine_new(c, &err);
    if (!e) fprintf(stderr, "  engine: %s\n", err.msg);
    return e;
}

/* The engine's request defaults for the prompt `text` and max_tokens
 * tokens, into *p (OUT). */
static inline void test_text_params(const kv_engine *e, kv_request_params *p, const char *text, int max_tokens) {
    kv_engine_request_defaults(e, p);
    p->text = text;
    p->max_tokens = max_tokens;
}

/* p: a request for the token ids (n of them) for max_tokens, ignore_eos
 * as given, the engine's default sampling. */
static inline void test_token_params(const kv_engine *e, kv_request_params *p, const int32_t *ids, int n,
                                     int max_tokens, int ignore_eos) {
    kv_engine_request_defaults(e, p);
    p->tokens = ids;
    p->n_tokens = n;
    p->max_tokens = max_tokens;
    p->ignore_eos = ignore_eos;
}

/* An engine of config c and, in p, a request for the prompt text (NULL,
 * the reason printed, when the engine cannot be made). */
static inline kv_engine *test_engine_text(const kv_config *c, kv_request_params *p, const char *text,
                                          int max_tokens) {
    kv_engine *e = test_engine_new(c);
    if (e) test_text_params(e, p, text, max_tokens);
    return e;
}

/* Submits the prompt `text`, or when it is NULL the n_ids token ids, for
 * max_tokens tokens (ignore_eos: exactly that many) tagged with `session`,
 * with the engine's default sampling. Returns the id, or <= 0 with the
 * reason printed. */
static inline int64_t test_submit(kv_engine *e, const char *text, const int32_t *ids, int n_ids, int max_tokens,
                                  int ignore_eos, int session) {
    kv_request_params p;
    test_token_params(e, &p, text ? NULL : ids, text ? 0 : n_ids, max_tokens, ignore_eos);
    p.text = text;
    p.session = session;
    kv_err err;
    int64_t id = kv_engine_submit(e, &p, &err);
    if (id <= 0) fprintf(stderr, "  submit %d: %s\n", session, err.msg);
    return id;
}

/* The tokenizer of the GGUF file at path (the file opened, read and closed
 * again: the tokenizer must not depend on the mapping), or NULL with err
 * set. */
static inline kv_tokenizer *test_gguf_tokenizer(const char *path, kv_err *err) {
    kv_gguf *g = kv_gguf_open(path, err);
    if (!g) return NULL;
    kv_tokenizer *t = kv_tokenizer_from_gguf(g, err);
    kv_gguf_close(g);
    return t;
}

/* kv_mkmodel's defaults cut to a tiny random model: 2 layers of width dim,
 * 4 heads of which 2 K/V heads, a feed-forward of ffn_dim. */
static inline kv_mkmodel_params test_tiny_model(int dim, int ffn_dim) {
    kv_mkmodel_params p = kv_mkmodel_default_params();
    p.dim = dim;
    p.n_layers = 2;
    p.n_heads = 4;
    p.n_kv_heads = 2;
    p.ffn_dim = ffn_dim;
    return p;
}

#endif
