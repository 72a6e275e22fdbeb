/* test_snapshot_parse.c - the attach client's reader of the snapshot JSON
 * (engine/snapshot_parse.c) against the server's writer
 * (server/snapshot_json.c) on a real engine (stories260K) mid-run: what is
 * read back writes out byte for byte as the original, delta frames append
 * their steps, and hostile frames (a block id outside the map, wrong types,
 * unknown names, cut text, huge counts) are rejected naming the member and
 * leave the snapshot as it was. */
#include <stdlib.h>
#include <string.h>

#include "../harness.h"
#include "../../engine/mkmodel.h"
#include "../../engine/snapshot_parse.h"
#include "../../server/snapshot_json.h"

static kv_engine *make(void) {
    kv_config c;
    kv_config_default(&c);
    kv_copy_str(c.model.path, sizeof c.model.path, harness_shared_path("models/stories260K.gguf"));
    c.threads = 1;
    c.kv.blocks = 64;
    c.kv.block_size = 4;
    c.kv.dtype = KV_CACHE_F32;
    c.scheduler.max_seqs = 2; /* a third request waits */
    c.sampling.temperature = 0;
    kv_err err;
    kv_engine *e = kv_engine_new(&c, &err);
    if (!e) fprintf(stderr, "  engine: %s\n", err.msg);
    return e;
}

static void submit(kv_engine *e, int session, int max_tokens) {
    static const int32_t ids[] = {1, 403, 407, 261, 378, 403, 407, 261, 378, 300, 301};
    kv_request_params p;
    kv_engine_request_defaults(e, &p);
    p.tokens = ids;
    p.n_tokens = (int)KV_ARRAY_LEN(ids);
    p.max_tokens = max_tokens;
    p.ignore_eos = 1;
    p.session = session;
    kv_err err;
    CHECK(kv_engine_submit(e, &p, &err) > 0);
}

/* The snapshot as JSON text (malloc'd). */
static char *to_json(const kv_snapshot *s, const char *model, int64_t since, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    int rc = srv_snapshot_write(f, s, model, since, NULL);
    fclose(f);
    if (rc) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void test_round_trip(void) {
    kv_engine *e = make();
    REQUIRE(e);
    for (int i = 0; i < 3; i++) submit(e, i, 20 + i);
    for (int i = 0; i < 6; i++) kv_engine_step(e);
    kv_snapshot *s = kv_snapshot_new(), *r = kv_snapshot_new();
    REQUIRE(s && r);
    REQUIRE(kv_engine_snapshot(e, s) == 0);
    CHECK(s->n_running == 2 && s->n_waiting == 1 && s->blocks_used > 0 && s->n_steps > 0 && s->n_decisions > 0);
    size_t len = 0, len2 = 0;
    char *text = to_json(s, "stories", -1, &len);
    REQUIRE(text);
    char model[64];
    kv_err err;
    CHECKF(kv_snapshot_parse(text, len, r, model, sizeof model, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(model, "stories"));
    CHECK(r->step == s->step && r->n_blocks == s->n_blocks && r->n_requests == s->n_requests);
    CHECK(r->blocks_used == s->blocks_used && r->block_size == 4 && r->kv_dtype == KV_CACHE_F32);
    CHECK(!memcmp(r->blocks, s->blocks, (size_t)s->n_blocks * sizeof *s->blocks));
    char *again = to_json(r, "stories", -1, &len2);
    REQUIRE(again);
    CHECKF(len == len2 && !memcmp(text, again, len), "written back differs:\n%.300s\n%.300s", text, again);
    free(again);
    /* a delta frame: only newer steps, appended to those held */
    int had = r->n_steps;
    uint64_t since = s->step;
    for (int i = 0; i < 3; i++) kv_engine_step(e);
    REQUIRE(kv_engine_snapshot(e, s) == 0);
    free(text);
    text = to_json(s, "stories", (int64_t)since, &len);
    REQUIRE(text);
    CHECKF(kv_snapshot_parse(text, len, r, NULL, 0, &err) == 0, "%s", err.msg);
    CHECKF(r->n_steps == KV_MIN(had + 3, KV_SNAPSHOT_PARSE_KEEP_STEPS), "%d steps after the delta (had %d)",
           r->n_steps, had);
    CHECK(r->steps[r->n_steps - 1].step == s->step);
    /* and its decisions (only the new steps') after those held: every
     * decision the engine made so far, in order, none twice, so a reader
     * that takes only the latest of several frames misses none */
    CHECKF(r->n_decisions == s->n_decisions && r->n_decisions > 0 &&
               !memcmp(r->decisions, s->decisions, (size_t)s->n_decisions * sizeof *s->decisions),
           "%d decisions after the delta, the engine has %d", r->n_decisions, s->n_decisions);
    /* the stream carries each block's fill (attach's F9 marks and gauge): 19 tokens: a block part full */
    int partial = 0;
    for (int i = 0; i < r->n_blocks; i++)
        partial += r->blocks[i].state == 1 /* used */ && r->blocks[i].fill > 0 && r->blocks[i].fill < r->block_size &&
                   r->blocks[i].fill == s->blocks[i].fill;
    CHECK(partial > 0);
    for (int i = 1; i < r->n_steps; i++) CHECK(r->steps[i].step > r->steps[i - 1].step);
    /* the same delta again adds nothing */
    CHECK(kv_snapshot_parse(text, len, r, NULL, 0, &err) == 0);
    CHECK(r->steps[r->n_steps - 1].step == s->step && r->n_steps == KV_MIN(had + 3, KV_SNAPSHOT_PARSE_KEEP_STEPS));
    CHECK(r->n_decisions == s->n_decisions);
    /* copy */
    kv_snapshot *c = kv_snapshot_new();
    REQUIRE(c);
    CHECK(kv_snapshot_copy(c, r) == 0);
    char *a = to_json(r, "m", -1, &len), *b = to_json(c, "m", -1, &len2);
    CHECK(a && b && len == len2 && !memcmp(a, b, len));
    free(a);
    free(b);
    kv_snapshot_free(c);
    free(text);
    kv_snapshot_free(s);
    kv_snapshot_free(r);
    kv_engine_free(e);
}

/* text with the first occurrence of from replaced by to (malloc'd). */
static char *patch(const char *text, const char *from, const char *to) {
    const char *at = strstr(text, from);
    if (!at) return NULL;
    size_t n = strlen(text) + strlen(to) + 1;
    char *o = malloc(n);
    if (!o) return NULL;
    snprintf(o, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    return o;
}

static void test_hostile(void) {
    kv_engine *e = make();
    REQUIRE(e);
    submit(e, 0, 8);
    for (int i = 0; i < 3; i++) kv_engine_step(e);
    kv_snapshot *s = kv_snapshot_new(), *r = kv_snapshot_new();
    REQUIRE(s && r && kv_engine_snapshot(e, s) == 0);
    size_t len;
    char *text = to_json(s, "m", -1, &len);
    REQUIRE(text);
    kv_err err;
    REQUIRE(kv_snapshot_parse(text, len, r, NULL, 0, &err) == 0);
    uint64_t step = r->step;
    int nreq = r->n_requests;
    char big[64];
    snprintf(big, sizeof big, "\"block_table\":[%d", s->n_blocks);
    static const struct {
        const char *from, *to, *says;
    } cases[] = {
        {"\"block_table\":[", NULL, "block_table"},            /* a block id outside the map (to: big) */
        {"\"state\":\"running\"", "\"state\":\"dancing\"", "requests[0].state"},
        {"\"paused\":false", "\"paused\":0", "paused"},
        {"\"n_prompt\":", "\"n_prompt\":1.5,\"x\":", "n_prompt"},
        {"\"blocks\":{\"state\":[", "\"blocks\":{\"state\":[\"free\",", "blocks.shared"},
        {"\"kv_dtype\":\"f32\"", "\"kv_dtype\":\"f33\"", "kv_dtype"},
        {"\"step\":", "\"step\":-4,\"y\":", "step"},
        {"\"running\":[", "\"running\":[1e300,", "running[0]"},
    };
    for (size_t i = 0; i < KV_ARRAY_LEN(cases); i++) {
        char *bad = patch(text, cases[i].from, cases[i].to ? cases[i].to : big);
        REQUIRE(bad);
        memset(&err, 0, sizeof err);
        int rc = kv_snapshot_parse(bad, strlen(bad), r, NULL, 0, &err);
        CHECKF(rc == KV_ERR_FORMAT && strstr(err.msg, cases[i].says), "case %zu: rc %d '%s'", i, rc, err.msg);
        CHECK(r->step == step && r->n_requests == nreq); /* unchanged */
        free(bad);
    }
    /* cut anywhere: rejected, never a crash */
    for (size_t cut = 0; cut < len; cut += 97) CHECK(kv_snapshot_parse(text, cut, r, NULL, 0, &err) != 0);
    CHECK(kv_snapshot_parse("[]", 2, r, NULL, 0, &err) == KV_ERR_FORMAT);
    CHECK(kv_snapshot_parse("{}", 2, r, NULL, 0, &err) == 0 && r->n_requests == 0); /* empty but valid */
    free(text);
    kv_snapshot_free(s);
    kv_snapshot_free(r);
    kv_engine_free(e);
}

/* A mixture-of-experts engine's per-expert row goes through the JSON and
 * back (the attach client's Sched line); a negative count is refused. */
static void test_experts_round_trip(void) {
    const char *path = harness_tmp_path("snapparse", "moe", ".gguf");
    kv_mkmodel_params p = kv_mkmodel_default_params();
    p.arch = "qwen3moe";
    p.n_experts = 8;
    p.n_experts_used = 2;
    p.head_dim = 32;
    kv_err err;
    REQUIRE(kv_mkmodel_write(&p, path, &err) == 0);
    kv_config c;
    kv_config_default(&c);
    kv_copy_str(c.model.path, sizeof c.model.path, path);
    c.threads = 1;
    kv_engine *e = kv_engine_new(&c, &err);
    REQUIRE(e);
    submit(e, 0, 4);
    for (int i = 0; i < 3; i++) kv_engine_step(e);
    kv_snapshot *s = kv_snapshot_new(), *r = kv_snapshot_new();
    REQUIRE(s && r && kv_engine_snapshot(e, s) == 0);
    CHECK(s->n_experts == 8);
    size_t len = 0, len2 = 0;
    char *text = to_json(s, "moe", -1, &len), *again = NULL;
    REQUIRE(text);
    CHECKF(kv_snapshot_parse(text, len, r, NULL, 0, &err) == 0, "%s", err.msg);
    CHECK(r->n_experts == 8 && !memcmp(r->expert_tokens, s->expert_tokens, 8 * sizeof(uint32_t)));
    REQUIRE((again = to_json(r, "moe", -1, &len2)));
    CHECK(len == len2 && !memcmp(text, again, len));
    char *bad = strstr(text, "\"experts\":[");
    REQUIRE(bad);
    memcpy(bad + 11, "-1", 2); /* the first count made negative (its digits overwritten) */
    CHECK(kv_snapshot_parse(text, len, r, NULL, 0, &err) == KV_ERR_FORMAT && strstr(err.msg, "experts"));
    FREE_ALL(text, again);
    kv_snapshot_free(s);
    kv_snapshot_free(r);
    kv_engine_free(e);
    unlink(path);
}

TEST_MAIN(T(test_round_trip), T(test_hostile), T(test_experts_round_trip))
