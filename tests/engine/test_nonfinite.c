/* test_nonfinite.c - NaN weights on stories260K: a NaN in a norm weight
 * loads with a warning that names the tensor (front ends print it), and a
 * request whose logits are not finite ends with KV_FINISH_ERROR and a
 * reason while the engine goes on serving the others: a NaN in one row of
 * the (untied) token embedding poisons only the requests that read it,
 * and a clean request beside it keeps the clean model's greedy text. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../engine/engine.h"
#include "../../engine/gguf.h"
#include "../../engine/model.h"
#include "../engine_helpers.h"
#include "../harness.h"

static char dir[] = "/tmp/kvtop-nonfinite-XXXXXX";
static char clean_path[1100], norm_path[1100], embd_path[1100];

/* A copy of the clean model at path with n floats set to NaN, from element
 * first of tensor name. Returns 0 or -1. */
static int poison(const char *path, const char *name, int64_t first, int64_t n) {
    kv_err err;
    kv_gguf *g = kv_gguf_open(clean_path, &err);
    if (!g) return -1;
    const kv_gguf_tensor *t = kv_gguf_find_tensor(g, name);
    long at = t && t->type == KV_TYPE_F32 ? (long)(kv_gguf_data_offset(g) + t->offset) : -1;
    kv_gguf_close(g);
    if (at < 0) return -1;
    FILE *in = fopen(clean_path, "rb"), *out = fopen(path, "wb");
    int rc = in && out ? 0 : -1;
    char buf[65536];
    size_t k;
    while (!rc && (k = fread(buf, 1, sizeof buf, in)) > 0) rc = fwrite(buf, 1, k, out) == k ? 0 : -1;
    float nan = NAN;
    for (int64_t i = 0; !rc && i < n; i++)
        rc = fseek(out, at + (long)((first + i) * 4), SEEK_SET) || fwrite(&nan, 4, 1, out) != 1 ? -1 : 0;
    if (in) fclose(in);
    if (out && fclose(out)) rc = -1;
    return rc;
}

static void setup(void) {
    REQUIRE(mkdtemp(dir));
    snprintf(clean_path, sizeof clean_path, "%.1000s", harness_shared_path("models/stories260K.gguf"));
    snprintf(norm_path, sizeof norm_path, "%s/norm.gguf", dir);
    snprintf(embd_path, sizeof embd_path, "%s/embd.gguf", dir);
}

static void teardown(void) {
    unlink(norm_path);
    unlink(embd_path);
    rmdir(dir);
}

static void test_norm_warning(void) {
    kv_err err;
    kv_model *m = kv_model_load(clean_path, NULL, &err);
    REQUIRE(m);
    CHECK(kv_model_warning(m)[0] == 0);
    kv_model_free(m);
    REQUIRE(poison(norm_path, "blk.0.attn_norm.weight", 3, 2) == 0);
    m = kv_model_load(norm_path, NULL, &err);
    REQUIRE(m);
    const char *w = kv_model_warning(m);
    CHECKF(strstr(w, norm_path) && strstr(w, "2 non-finite values") && strstr(w, "blk.0.attn_norm.weight[3]"), "%s",
           w);
    kv_model_free(m);
}

static kv_engine *engine_on(const char *path) {
    kv_config c;
    test_engine_config(&c, path, 1, 64, 4, 0);
    c.sampling.temperature = 0;
    return test_engine_new(&c);
}

static int64_t submit(kv_engine *e, const int32_t *ids, int n, int max_tokens) {
    return test_submit(e, NULL, ids, n, max_tokens, 1, 0);
}

/* Runs e until idle; the DONE of request a and b (when > 0) into fa/fb,
 * and the tokens request a generated marked in used (when not NULL). */
static void run(kv_engine *e, int64_t a, kv_finish *fa, char *why_a, int64_t b, kv_finish *fb, int *used) {
    CHECK(kv_engine_run_until_idle(e) == 0);
    kv_event ev[64];
    int n;
    while ((n = kv_engine_poll(e, ev, 64)) > 0)
        for (int i = 0; i < n; i++) {
            if (ev[i].type == KV_EVENT_TOKEN && ev[i].req == a && used && ev[i].token >= 0 && ev[i].token < 512)
                used[ev[i].token] = 1;
            if (ev[i].type != KV_EVENT_DONE) continue;
            if (ev[i].req == a) {
                *fa = ev[i].finish;
                if (why_a) snprintf(why_a, 128, "%s", ev[i].reason);
            }
            if (ev[i].req == b && fb) *fb = ev[i].finish;
        }
}

static void test_nan_logits_end_one_request(void) {
    /* the clean model's greedy continuation of a short prompt, and a token
     * neither its prompt nor its output uses */
    int32_t clean[4] = {1, 403, 261, 280};
    int used[512] = {0};
    for (int i = 0; i < 4; i++) used[clean[i]] = 1;
    kv_engine *e = engine_on(clean_path);
    REQUIRE(e);
    int64_t id = submit(e, clean, 4, 12);
    REQUIRE(id > 0);
    kv_finish f = KV_FINISH_NONE;
    run(e, id, &f, NULL, 0, NULL, used);
    char want[512] = "";
    kv_engine_request_text(e, id, want, sizeof want);
    CHECK(f == KV_FINISH_LENGTH && want[0]);
    kv_engine_free(e);
    int32_t t = 3;
    while (t < 511 && used[t]) t++;
    REQUIRE(poison(embd_path, "token_embd.weight", (int64_t)t * 64, 64) == 0); /* row t: dim 64 */

    e = engine_on(embd_path);
    REQUIRE(e);
    int32_t bad[5] = {1, 403, t, 261, 280};
    int64_t a = submit(e, bad, 5, 12), b = submit(e, clean, 4, 12);
    REQUIRE(a > 0 && b > 0);
    kv_finish fa = KV_FINISH_NONE, fb = KV_FINISH_NONE;
    char why[128] = "";
    run(e, a, &fa, why, b, &fb, NULL);
    CHECKF(fa == KV_FINISH_ERROR && strstr(why, "not finite"), "finish %d: %s", (int)fa, why);
    char got[512] = "";
    kv_engine_request_text(e, b, got, sizeof got);
    CHECKF(fb == KV_FINISH_LENGTH && !strcmp(got, want), "finish %d: '%s' vs '%s'", (int)fb, got, want);
    /* and the engine serves the next one */
    int64_t c = submit(e, clean, 4, 12);
    kv_finish fc = KV_FINISH_NONE;
    run(e, c, &fc, NULL, 0, NULL, NULL);
    CHECK(fc == KV_FINISH_LENGTH);
    char msg[256];
    CHECKF(kv_engine_check(e, msg, sizeof msg) == 0, "%s", msg);
    kv_engine_free(e);

    /* a NaN norm poisons every request: each ends with the error */
    e = engine_on(norm_path);
    REQUIRE(e);
    a = submit(e, clean, 4, 6);
    fa = KV_FINISH_NONE;
    run(e, a, &fa, why, 0, NULL, NULL);
    CHECKF(fa == KV_FINISH_ERROR && strstr(why, "not finite"), "finish %d: %s", (int)fa, why);
    kv_engine_free(e);
}

TEST_MAIN(T(setup), T(test_norm_warning), T(test_nan_logits_end_one_request), T(teardown))
