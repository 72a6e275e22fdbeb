/* test_profile.c - the YAML profile loader, --set, the config dump and the
 * key table: each bad input is rejected with the right file:line:column
 * and leaves the config untouched; every shipped profile loads. */
#include <dirent.h>
#include <stdint.h>
#include <unistd.h>

#include "../../engine/config.h"
#include "../../kernels/backend.h"
#include "../../profiles/profile.h"
#include "../harness.h"

/* Writes text to a fresh temp file; returns its path (static, one at a time). */
static const char *write_tmp(const char *text) {
    static char path[512];
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/kvtop-profile-XXXXXX.yaml", dir && *dir ? dir : "/tmp");
    int fd = mkstemps(path, 5);
    if (fd < 0) return NULL;
    size_t n = strlen(text);
    if (write(fd, text, n) != (ssize_t)n) {
        close(fd);
        return NULL;
    }
    close(fd);
    return path;
}

/* Loads `text` from a temp file and expects failure with code `code` and
 * a message containing "<path>:<where>" (where = "L:C: " or NULL) and
 * `needle`. Checks the config stayed byte for byte what it was. */
static void expect_fail(const char *text, int code, const char *where, const char *needle, int line) {
    const char *p = write_tmp(text);
    if (!p) {
        CHECKF(0, "cannot write a temp file (test line %d)", line);
        return;
    }
    kv_config cfg, before;
    memset(&cfg, 0xA5, sizeof cfg);
    before = cfg;
    kv_err err;
    kv_err_clear(&err);
    int rc = kv_profile_load(p, &cfg, &err);
    CHECKF(rc == code, "test line %d: rc %d, want %d (%s)", line, rc, code, err.msg);
    if (where) {
        char want[600];
        snprintf(want, sizeof want, "%s:%s", p, where);
        CHECKF(strstr(err.msg, want) != NULL, "test line %d: message '%s' lacks '%s'", line, err.msg, want);
    }
    CHECKF(strstr(err.msg, needle) != NULL, "test line %d: message '%s' lacks '%s'", line, err.msg, needle);
    CHECKF(memcmp(&cfg, &before, sizeof cfg) == 0, "test line %d: config changed on error", line);
    unlink(p);
}
#define EXPECT_FAIL(text, code, where, needle) expect_fail(text, code, where, needle, __LINE__)

static int load_text(const char *text, kv_config *cfg, kv_err *err) {
    return kv_profile_load_mem(text, strlen(text), "t.yaml", cfg, err);
}

static void test_defaults_valid(void) {
    kv_config c;
    kv_config_default(&c);
    kv_err err;
    CHECKF(kv_config_validate(&c, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(c.model.path, "models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    CHECK(c.kv.block_size == 16 && c.kv.memory == 256ull << 20 && c.kv.dtype == KV_CACHE_F16);
    CHECK(c.kv.prefix_sharing == 1 && c.kv.layout == KV_LAYOUT_PAGED);
    CHECK(c.scheduler.max_seqs == 64 && c.scheduler.max_batched_tokens == 512 && c.scheduler.prefill_chunk == 256);
    CHECK(c.sampling.top_k == 40 && fabsf(c.sampling.temperature - 0.7f) < 1e-6f && c.sampling.seed == 0);
    CHECK(c.spec.method == KV_SPEC_OFF && c.spec.k == 4 && c.spec.ngram_n == 3);
    CHECK(c.workload.requests == 32 && c.workload.arrival == KV_ARRIVAL_POISSON && c.workload.rate == 4);
    CHECK(c.workload.prompt_len.kind == KV_DIST_LOGNORMAL && c.workload.prompt_len.mean == 128 &&
          c.workload.prompt_len.max == 1024);
    CHECK(c.workload.output_len.sigma == 0.6 && c.workload.output_len.max == 512);
    CHECK(c.ui.fps == 10 && !strcmp(c.ui.theme, "auto"));
    /* An empty profile is the defaults. */
    kv_config d;
    CHECKF(load_text("", &d, &err) == 0, "%s", err.msg);
    CHECK(memcmp(&c, &d, sizeof c) == 0);
    CHECKF(load_text("# only a comment\n", &d, &err) == 0, "%s", err.msg);
}

static void test_shipped_profiles_load(void) {
    DIR *dir = opendir("profiles");
    REQUIRE(dir != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".yaml")) continue;
        char path[600];
        snprintf(path, sizeof path, "profiles/%s", e->d_name);
        kv_config c;
        kv_err err;
        int rc = kv_profile_load(path, &c, &err);
        CHECKF(rc == 0, "%s: %s", path, err.msg);
        if (!rc) CHECKF(kv_config_validate(&c, &err) == 0, "%s: %s", path, err.msg);
        n++;
    }
    closedir(dir);
    CHECKF(n >= 5, "found %d profiles", n);

    kv_config c;
    kv_err err;
    REQUIRE(kv_profile_load("profiles/demo-batching.yaml", &c, &err) == 0);
    CHECK(!strcmp(c.model.path, "../shared/models/stories260K.gguf"));
    CHECK(c.workload.requests == 64 && c.workload.arrival == KV_ARRIVAL_BURST && c.workload.ignore_eos == 1);
    CHECK(c.workload.output_len.kind == KV_DIST_LOGNORMAL && c.workload.output_len.sigma >= 0.8);
    REQUIRE(kv_profile_load("profiles/demo-prefix.yaml", &c, &err) == 0);
    CHECK(c.workload.system_prompt_len == 512 && c.kv.prefix_sharing == 1);
    REQUIRE(kv_profile_load("profiles/bench-concurrency.yaml", &c, &err) == 0);
    CHECK(c.workload.arrival == KV_ARRIVAL_CLOSED && c.workload.prompt_len.kind == KV_DIST_FIXED &&
          c.workload.prompt_len.value == 128 && c.workload.output_len.value == 128);
    CHECK(!strcmp(c.model.path, "models/rand-110m-q8_0.gguf"));
    REQUIRE(kv_profile_load("profiles/demo-paging.yaml", &c, &err) == 0);
    CHECK(c.kv.layout == KV_LAYOUT_PAGED && c.kv.memory == 4ull << 20 && c.scheduler.max_seq_len == 1024);
    /* The comparisons the profiles advertise are valid overrides. */
    const char *cmp[] = {"scheduler.policy=static", "kv.layout=contiguous", "kv.prefix_sharing=false",
                         "workload.concurrency=32"};
    const char *files[] = {"profiles/demo-batching.yaml", "profiles/demo-paging.yaml", "profiles/demo-prefix.yaml",
                           "profiles/bench-concurrency.yaml"};
    for (int i = 0; i < 4; i++)
        CHECKF(kv_profile_load_with_sets(files[i], &cmp[i], 1, &c, &err) == 0, "%s + %s: %s", files[i], cmp[i],
               err.msg);
}

static void test_values_parse(void) {
    kv_config c;
    kv_err err;
    const char *y = "model:\n  path: \"a b/c.gguf\"\n  tokenizer: ''\n"
                    "threads: 3\nbackend: sim\nsim_device: a100\n"
                    "kv:\n  block_size: 32\n  memory: 1.5GiB\n  dtype: fp8_e5m2\n  prefix_sharing: no\n"
                    "  layout: contiguous\n  swap_memory: 64M\n"
                    "scheduler:\n  policy: static\n  preemption: swap\n  max_wait_ms: 12.5\n"
                    "sampling:\n  temperature: 0\n  top_p: 1\n  seed: 18446744073709551615\n"
                    "spec: {method: ngram, k: 8, ngram_n: 2, adaptive: off}\n"
                    "workload:\n  arrival: burst\n  rate: 0\n"
                    "  prompt_len: {dist: uniform, min: 10, max: 20}\n  output_len: 77\n"
                    "ui:\n  theme: mono\n";
    REQUIRE(kv_profile_load_mem(y, strlen(y), "x.yaml", &c, &err) == 0 || (printf("%s\n", err.msg), 0));
    CHECK(!strcmp(c.model.path, "a b/c.gguf") && c.model.tokenizer[0] == '\0');
    CHECK(c.threads == 3 && !strcmp(c.backend, "sim") && !strcmp(c.sim_device, "a100"));
    CHECK(c.kv.block_size == 32 && c.kv.memory == 3ull << 29 && c.kv.dtype == KV_CACHE_FP8_E5M2);
    CHECK(c.kv.prefix_sharing == 0 && c.kv.layout == KV_LAYOUT_CONTIGUOUS && c.kv.swap_memory == 64ull << 20);
    CHECK(c.scheduler.policy == KV_POLICY_STATIC && c.scheduler.preemption == KV_PREEMPT_SWAP &&
          c.scheduler.max_wait_ms == 12.5);
    CHECK(c.sampling.temperature == 0 && c.sampling.top_p == 1 && c.sampling.seed == UINT64_MAX);
    CHECK(c.spec.method == KV_SPEC_NGRAM && c.spec.k == 8 && c.spec.ngram_n == 2 && c.spec.adaptive == 0);
    CHECK(c.workload.arrival == KV_ARRIVAL_BURST && c.workload.rate == 0);
    CHECK(c.workload.prompt_len.kind == KV_DIST_UNIFORM && c.workload.prompt_len.min == 10 &&
          c.workload.prompt_len.max == 20);
    CHECK(c.workload.output_len.kind == KV_DIST_FIXED && c.workload.output_len.value == 77);
    CHECK(!strcmp(c.ui.theme, "mono"));
    /* A section whose keys are all commented out. */
    CHECKF(load_text("kv:\n  # block_size: 8\nui:\n", &c, &err) == 0, "%s", err.msg);
}

static void test_load_errors(void) {
    EXPECT_FAIL("kv:\n  blok_size: 32\n", KV_ERR_INVAL, "2:3: ", "unknown key 'kv.blok_size' (did you mean 'kv.block_size'?)");
    EXPECT_FAIL("block_size: 32\n", KV_ERR_INVAL, "1:1: ", "did you mean 'kv.block_size'?");
    EXPECT_FAIL("schedular:\n  policy: static\n", KV_ERR_INVAL, "1:1: ", "did you mean 'scheduler'?");
    EXPECT_FAIL("kv:\n  zzzzzzzz: 1\n", KV_ERR_INVAL, "2:3: ", "unknown key 'kv.zzzzzzzz'");
    EXPECT_FAIL("kv:\n  block_size: abc\n", KV_ERR_INVAL, "2:15: ", "kv.block_size: expected an integer, got 'abc'");
    EXPECT_FAIL("kv:\n  block_size: 16.5\n", KV_ERR_INVAL, "2:15: ", "expected an integer");
    EXPECT_FAIL("kv:\n  block_size: 0\n", KV_ERR_INVAL, "2:15: ", "kv.block_size: must be in [1, 1024], got 0");
    EXPECT_FAIL("kv:\n  block_size: 99999999999999999999\n", KV_ERR_INVAL, "2:15: ", "expected an integer");
    EXPECT_FAIL("sampling:\n  top_p: 0\n", KV_ERR_INVAL, "2:10: ", "sampling.top_p: must be in (0, 1]");
    EXPECT_FAIL("sampling:\n  min_p: 1\n", KV_ERR_INVAL, "2:10: ", "must be in [0, 1)");
    EXPECT_FAIL("sampling:\n  temperature: nan\n", KV_ERR_INVAL, "2:16: ", "expected a number");
    EXPECT_FAIL("kv:\n  block_size: 16\n  memory: 1GiB\n  block_size: 32\n", KV_ERR_INVAL, "4:3: ",
                "duplicate key 'kv.block_size' (first at line 2)");
    EXPECT_FAIL("kv:\n  dtype: f64\n", KV_ERR_INVAL, "2:10: ",
                "kv.dtype: unknown value 'f64' (expected f32|f16|int8|int8_asym|fp8_e4m3|fp8_e5m2)");
    EXPECT_FAIL("scheduler:\n  policy: dynamic\n", KV_ERR_INVAL, "2:11: ", "expected continuous|static");
    EXPECT_FAIL("backend: tpu\n", KV_ERR_INVAL, "1:10: ", "backend: unknown value 'tpu' (expected cpu|cuda|sim)");
    EXPECT_FAIL("kv:\n  memory: 12XB\n", KV_ERR_INVAL, "2:11: ", "kv.memory: expected a size");
    EXPECT_FAIL("kv:\n  memory: 1.5\n", KV_ERR_INVAL, "2:11: ", "kv.memory: expected a size");
    EXPECT_FAIL("kv:\n  memory: 2TiB\n", KV_ERR_INVAL, "2:11: ", "kv.memory: must be in [0, 1TiB], got 2TiB");
    EXPECT_FAIL("kv:\n  prefix_sharing: maybe\n", KV_ERR_INVAL, "2:19: ", "expected true or false, got 'maybe'");
    EXPECT_FAIL("kv:\n  block_size:\n", KV_ERR_INVAL, "2:", "kv.block_size: expected an integer, got nothing");
    EXPECT_FAIL("threads: {a: 1}\n", KV_ERR_INVAL, "1:10: ", "threads: expected an integer, got a mapping");
    EXPECT_FAIL("threads: [1, 2]\n", KV_ERR_INVAL, "1:10: ", "got a list");
    EXPECT_FAIL("kv: 5\n", KV_ERR_INVAL, "1:5: ", "kv: is a section");
    EXPECT_FAIL("model:\n  path: \"\"\n", KV_ERR_INVAL, "2:9: ", "model.path: must not be empty");
    EXPECT_FAIL("- a\n- b\n", KV_ERR_INVAL, "1:1: ", "a profile is a mapping");
    EXPECT_FAIL("threads: 1\n---\nthreads: 2\n", KV_ERR_INVAL, "3:1: ", "found a second");
    EXPECT_FAIL("? [a]\n: 1\n", KV_ERR_INVAL, "1:3: ", "keys must be plain names");
    /* Distributions. */
    EXPECT_FAIL("workload:\n  prompt_len: {dist: lognormal, mena: 3, sigma: 1}\n", KV_ERR_INVAL, "2:33: ",
                "workload.prompt_len: unknown field 'mena' (did you mean 'mean'?)");
    EXPECT_FAIL("workload:\n  prompt_len: {mean: 30, sigma: 1}\n", KV_ERR_INVAL, "2:15: ", "missing 'dist:");
    EXPECT_FAIL("workload:\n  prompt_len: {dist: lognormal, mean: 30}\n", KV_ERR_INVAL, "2:15: ",
                "dist lognormal needs 'sigma'");
    EXPECT_FAIL("workload:\n  prompt_len: {dist: uniform, min: 30, max: 20}\n", KV_ERR_INVAL, "2:15: ",
                "workload.prompt_len.min: 30 is above workload.prompt_len.max (20)");
    EXPECT_FAIL("workload:\n  prompt_len: {dist: gamma, value: 3}\n", KV_ERR_INVAL, "2:22: ",
                "workload.prompt_len.dist: unknown distribution 'gamma'");
    EXPECT_FAIL("workload:\n  output_len: {dist: fixed, value: 0}\n", KV_ERR_INVAL, "2:36: ",
                "workload.output_len.value: must be in [1, 1048576], got 0");
    EXPECT_FAIL("workload:\n  output_len: {dist: fixed, value: 3, value: 4}\n", KV_ERR_INVAL, "2:39: ",
                "workload.output_len.value: duplicate key");
    EXPECT_FAIL("workload:\n  output_len: {dist: lognormal, mean: 5, sigma: 9}\n", KV_ERR_INVAL, "2:49: ",
                "workload.output_len.sigma: must be in [0, 4]");
    EXPECT_FAIL("workload:\n  output_len: x\n", KV_ERR_INVAL, "2:15: ", "expected an integer token count");
    /* Validation across keys points at the key it names. */
    EXPECT_FAIL("kv:\n  memory: 0\n", KV_ERR_INVAL, "2:11: ", "kv.memory: kv.memory, kv.blocks and memory.budget are all 0");
    EXPECT_FAIL("spec:\n  method: draft_model\n", KV_ERR_INVAL, NULL, "spec.draft_model: required");
    EXPECT_FAIL("scheduler:\n  max_seq_len: 256\nworkload:\n  output_len: 200\n", KV_ERR_INVAL, "4:15: ",
                "exceeds scheduler.max_seq_len (256)");
    /* YAML syntax errors, with libyaml's position. */
    EXPECT_FAIL("kv:\n  block_size: [1, 2\n", KV_ERR_FORMAT, "3:1: ", "invalid YAML");
    EXPECT_FAIL("kv:\n  block_size: 1\n bad: 2\n", KV_ERR_FORMAT, "3:", "invalid YAML");
    EXPECT_FAIL("kv: {a: 1\n", KV_ERR_FORMAT, NULL, "invalid YAML");
    EXPECT_FAIL("threads: *nope\n", KV_ERR_FORMAT, "1:10: ", "invalid YAML");
    EXPECT_FAIL("threads: 1\nbackend: \"cpu\xff\"\n", KV_ERR_FORMAT, "2:", "invalid YAML");
    EXPECT_FAIL("threads: \"\\0\"\n", KV_ERR_INVAL, "1:10: ", "NUL");

    /* Hostile nesting is refused early (libyaml is quadratic in depth). */
    {
        size_t d = 60000;
        char *deep = malloc(2 * d + 16);
        REQUIRE(deep);
        memcpy(deep, "kv: ", 4);
        memset(deep + 4, '[', d);
        memset(deep + 4 + d, ']', d);
        memcpy(deep + 4 + 2 * d, "\n", 2);
        EXPECT_FAIL(deep, KV_ERR_FORMAT, "1:20: ", "nested deeper than 16 levels");
        free(deep);
    }

    /* A missing file. */
    kv_config c, before;
    memset(&c, 0x5A, sizeof c);
    before = c;
    kv_err err;
    CHECK(kv_profile_load("no/such/profile.yaml", &c, &err) == KV_ERR_IO);
    CHECKF(strstr(err.msg, "no/such/profile.yaml") && strstr(err.msg, "cannot open"), "%s", err.msg);
    CHECK(memcmp(&c, &before, sizeof c) == 0);
    CHECK(kv_profile_load("profiles", &c, &err) < 0); /* a directory */
    CHECK(memcmp(&c, &before, sizeof c) == 0);
}

static void test_sizes(void) {
    static const struct {
        const char *text;
        uint64_t want;
    } ok[] = {
        {"12", 12},           {"256MiB", 256ull << 20}, {"1GiB", 1ull << 30}, {"512KB", 512000},
        {"64K", 64ull << 10}, {"1.5GiB", 3ull << 29},   {"2 MB", 2000000},   {"3gib", 3ull << 30},
        {"7b", 7},            {"1TiB", 1ull << 40},     {"0", 0},
    };
    for (size_t i = 0; i < KV_ARRAY_LEN(ok); i++) {
        kv_config c;
        kv_config_default(&c);
        char a[64];
        snprintf(a, sizeof a, "kv.swap_memory=%s", ok[i].text);
        kv_err err;
        CHECKF(kv_profile_set(&c, a, &err) == 0, "%s: %s", a, err.msg);
        CHECKF(c.kv.swap_memory == ok[i].want, "%s -> %llu", a, (unsigned long long)c.kv.swap_memory);
    }
    static const char *bad[] = {"12XB", "1.5", "-5", "", "MiB", "1.GiB", "99999999999TiB", "18446744073709551616",
                                "1e3", "12 ", "0x10"};
    for (size_t i = 0; i < KV_ARRAY_LEN(bad); i++) {
        kv_config c, before;
        kv_config_default(&c);
        before = c;
        char a[64];
        snprintf(a, sizeof a, "kv.swap_memory=%s", bad[i]);
        kv_err err;
        int rc = kv_profile_set(&c, a, &err);
        /* "12 " is trimmed by --set and therefore fine; everything else fails */
        if (!strcmp(bad[i], "12 ")) {
            CHECK(rc == 0 && c.kv.swap_memory == 12);
            continue;
        }
        CHECKF(rc == KV_ERR_INVAL && strstr(err.msg, "kv.swap_memory"), "%s: rc %d %s", a, rc, err.msg);
        CHECK(memcmp(&c, &before, sizeof c) == 0);
    }
}

static void test_set(void) {
    kv_config c;
    kv_config_default(&c);
    kv_err err;
    CHECK(kv_profile_set(&c, "kv.prefix_sharing=false", &err) == 0 && c.kv.prefix_sharing == 0);
    CHECK(kv_profile_set(&c, " kv.block_size = 32 ", &err) == 0 && c.kv.block_size == 32);
    CHECK(kv_profile_set(&c, "kv.dtype=fp8", &err) == 0 && c.kv.dtype == KV_CACHE_FP8_E4M3);
    CHECK(kv_profile_set(&c, "kv.dtype=INT8", &err) == 0 && c.kv.dtype == KV_CACHE_INT8);
    CHECK(kv_profile_set(&c, "workload.prompt_len=64", &err) == 0);
    CHECK(c.workload.prompt_len.kind == KV_DIST_FIXED && c.workload.prompt_len.value == 64);
    CHECK(kv_profile_set(&c, "workload.prompt_len.dist=lognormal", &err) == 0);
    CHECK(kv_profile_set(&c, "workload.prompt_len.mean=200", &err) == 0);
    CHECK(c.workload.prompt_len.kind == KV_DIST_LOGNORMAL && c.workload.prompt_len.mean == 200 &&
          c.workload.prompt_len.sigma == 0.5);
    CHECKF(kv_profile_set(&c, "workload.output_len={dist: uniform, min: 8, max: 64}", &err) == 0, "%s", err.msg);
    CHECK(c.workload.output_len.kind == KV_DIST_UNIFORM && c.workload.output_len.min == 8 &&
          c.workload.output_len.max == 64);
    CHECK(kv_profile_set(&c, "model.path=x=y.gguf", &err) == 0 && !strcmp(c.model.path, "x=y.gguf"));
    CHECK(kv_profile_set(&c, "model.tokenizer=", &err) == 0 && c.model.tokenizer[0] == '\0');
    CHECK(kv_profile_set(&c, "sampling.seed=42", &err) == 0 && c.sampling.seed == 42);
    CHECK(kv_profile_set(&c, "spec.method=self", &err) == 0 && c.spec.method == KV_SPEC_SELF);
    /* max_seqs auto: stored as KV_KEY_AUTO_VALUE, counted as its ceiling (at most max_batched_tokens) */
    CHECK(kv_profile_set(&c, "scheduler.max_seqs=auto", &err) == 0 && c.scheduler.max_seqs == KV_KEY_AUTO_VALUE);
    CHECK(kv_config_validate(&c, &err) == 0 && kv_config_batch_dynamic(&c));
    CHECK(kv_config_max_seqs(&c) == KV_MIN(KV_MAX_SEQS_AUTO_CEIL, c.scheduler.max_batched_tokens));
    CHECK(kv_profile_set(&c, "scheduler.max_batched_tokens=100", &err) == 0 && kv_config_max_seqs(&c) == 100);
    CHECK(kv_profile_set(&c, "scheduler.max_seqs=8", &err) == 0 && kv_config_max_seqs(&c) == 8 &&
          !kv_config_batch_dynamic(&c));

    static const struct {
        const char *set, *needle;
    } bad[] = {
        {"kv.block_size=abc", "--set kv.block_size=abc: kv.block_size: expected an integer, got 'abc'"},
        {"kv.block_size=2000", "kv.block_size: must be in [1, 1024], got 2000"},
        {"kv.blok_size=3", "unknown key 'kv.blok_size' (did you mean 'kv.block_size'?)"},
        {"prefix_sharing=true", "did you mean 'kv.prefix_sharing'?"},
        {"kv=3", "'kv' is a section; set one of its keys, e.g. kv.block_size"},
        {"kv.block_size", "expected key=value"},
        {"workload.prompt_len.mena=3", "did you mean 'workload.prompt_len.mean'?"},
        {"workload.prompt_len.mean=abc", "workload.prompt_len.mean: expected a number"},
        {"workload.prompt_len.min=0", "workload.prompt_len.min: must be in [1, 1048576], got 0"},
        {"workload.prompt_len={dist: uniform, min: 9}", "dist uniform needs 'max'"},
        {"workload.prompt_len={dist: uniform", "not a valid {dist: ...} mapping"},
        {"workload.prompt_len=-3", "must be in [1, 1048576]"},
        {"ui.theme=pink", "ui.theme: unknown value 'pink' (expected auto|mono)"},
        {"kv.dtype=", "kv.dtype: unknown value ''"},
        {"scheduler.max_seqs=0", "scheduler.max_seqs: must be in [1, 4096], got 0"},
        {"scheduler.max_seqs=Auto", "scheduler.max_seqs: expected an integer or auto, got 'Auto'"},
        {"scheduler.max_seqs=auto8", "expected an integer or auto"},
        {"=3", "unknown key ''"},
    };
    for (size_t i = 0; i < KV_ARRAY_LEN(bad); i++) {
        kv_config before = c;
        int rc = kv_profile_set(&c, bad[i].set, &err);
        CHECKF(rc == KV_ERR_INVAL, "%s: rc %d", bad[i].set, rc);
        CHECKF(strstr(err.msg, bad[i].needle) != NULL, "%s: '%s' lacks '%s'", bad[i].set, err.msg, bad[i].needle);
        CHECKF(memcmp(&c, &before, sizeof c) == 0, "%s changed the config", bad[i].set);
    }
    char longv[2000];
    memset(longv, 'a', sizeof longv);
    memcpy(longv, "model.path=", 11);
    longv[sizeof longv - 1] = '\0';
    CHECK(kv_profile_set(&c, longv, &err) == KV_ERR_INVAL && strstr(err.msg, "too long"));
}

static void test_load_with_sets(void) {
    const char *p = write_tmp("kv:\n  block_size: 8\nscheduler:\n  max_seqs: 4\n");
    REQUIRE(p);
    kv_config c;
    kv_err err;
    const char *sets[] = {"kv.block_size=32", "scheduler.preemption=swap", "kv.swap_memory=1GiB"};
    CHECKF(kv_profile_load_with_sets(p, sets, 3, &c, &err) == 0, "%s", err.msg);
    CHECK(c.kv.block_size == 32 && c.scheduler.max_seqs == 4 && c.kv.swap_memory == 1ull << 30);
    /* Validation runs once, after every --set: an inconsistent middle state is fine ... */
    /* ... but an inconsistent end is not, and the error names the --set. */
    kv_config before;
    memset(&c, 0x11, sizeof c);
    before = c;
    const char *bad[] = {"kv.memory=0", "kv.blocks=0"};
    CHECK(kv_profile_load_with_sets(p, bad, 2, &c, &err) == KV_ERR_INVAL);
    CHECKF(strstr(err.msg, "--set kv.memory=0: kv.memory:"), "%s", err.msg);
    CHECK(memcmp(&c, &before, sizeof c) == 0);
    const char *bad2[] = {"kv.block_size=x"};
    CHECK(kv_profile_load_with_sets(p, bad2, 1, &c, &err) == KV_ERR_INVAL && strstr(err.msg, "--set kv.block_size=x"));
    CHECK(memcmp(&c, &before, sizeof c) == 0);
    /* No profile: defaults plus sets. */
    const char *one[] = {"threads=2"};
    CHECK(kv_profile_load_with_sets(NULL, one, 1, &c, &err) == 0 && c.threads == 2);
    unlink(p);
}

/* Key by key, through the formatter (which writes exact values). */
static void check_same(const kv_config *a, const kv_config *b) {
    int n;
    const kv_config_key *keys = kv_config_keys(&n);
    for (int i = 0; i < n; i++) {
        char x[1200], y[1200];
        kv_config_key_format(&keys[i], a, x, sizeof x);
        kv_config_key_format(&keys[i], b, y, sizeof y);
        CHECKF(!strcmp(x, y), "%s: '%s' vs '%s'", keys[i].path, x, y);
    }
}

static void test_dump_roundtrip(void) {
    kv_config c;
    kv_config_default(&c);
    kv_err err;
    const char *sets[] = {
        "model.path=we\"ird \\path\t/\xc3\xa9t\xc3\xa9 #1: 'x'.gguf", "model.tokenizer=- [not, a list]",
        "threads=7", "kv.memory=1000001", "kv.swap_memory=3GiB", "kv.dtype=int8_asym", "kv.layout=contiguous",
        "scheduler.max_wait_ms=0.1", "sampling.temperature=0.3", "sampling.top_p=0.9",
        "sampling.seed=12345678901234567890", "spec.method=draft_model", "spec.draft_model=null",
        "spec.min_acceptance=0.123456789", "workload.rate=3.3333333333333335", "workload.arrival=closed",
        "workload.prompt_len={dist: uniform, min: 3, max: 9}", "workload.output_len.sigma=1.25",
        "workload.prompts_file=true", "ui.show_token_source=false", "sim_device=~", "scheduler.max_seqs=auto",
    };
    for (size_t i = 0; i < KV_ARRAY_LEN(sets); i++) CHECKF(kv_profile_set(&c, sets[i], &err) == 0, "%s: %s", sets[i], err.msg);
    REQUIRE(kv_config_validate(&c, &err) == 0 || (printf("%s\n", err.msg), 0));
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    REQUIRE(f);
    CHECK(kv_profile_dump(&c, f) == 0);
    fclose(f);
    kv_config d;
    int rc = kv_profile_load_mem(text, len, "dump.yaml", &d, &err);
    CHECKF(rc == 0, "%s\n%s", err.msg, text);
    if (!rc) {
        check_same(&c, &d);
        CHECK(memcmp(&c, &d, sizeof c) == 0);
        /* And the dump of the reloaded config is the same text. */
        char *t2 = NULL;
        size_t l2 = 0;
        FILE *g = open_memstream(&t2, &l2);
        kv_profile_dump(&d, g);
        fclose(g);
        CHECK(l2 == len && !memcmp(text, t2, len));
        free(t2);
    }
    /* The defaults round trip too. */
    kv_config_default(&c);
    free(text);
    f = open_memstream(&text, &len);
    kv_profile_dump(&c, f);
    fclose(f);
    CHECK(kv_profile_load_mem(text, len, "dump.yaml", &d, &err) == 0);
    CHECK(memcmp(&c, &d, sizeof c) == 0);
    free(text);
}

static void test_key_table(void) {
    int n;
    const kv_config_key *keys = kv_config_keys(&n);
    CHECK(n > 40);
    kv_config def;
    kv_config_default(&def);
    for (int i = 0; i < n; i++) {
        /* Unique paths that find themselves. */
        CHECK(kv_config_key_find(keys[i].path) == &keys[i]);
        CHECK(keys[i].doc && keys[i].doc[0]);
        /* Every default formats to text that --set reads back to the same. */
        char v[1200], a[1300], w[1200];
        kv_config_key_format(&keys[i], &def, v, sizeof v);
        snprintf(a, sizeof a, "%s=%s", keys[i].path, v);
        kv_config c = def;
        kv_err err;
        CHECKF(kv_profile_set(&c, a, &err) == 0, "%s: %s", a, err.msg);
        kv_config_key_format(&keys[i], &c, w, sizeof w);
        CHECKF(!strcmp(v, w), "%s: %s -> %s", keys[i].path, v, w);
    }
    CHECK(kv_config_key_find("kv") == NULL && kv_config_key_find("nope") == NULL);
    /* The kv.dtype names are the kernels' names. */
    const kv_config_key *dt = kv_config_key_find("kv.dtype");
    REQUIRE(dt && dt->type == KV_KEY_ENUM);
    for (int i = 0; i < KV_CACHE_DTYPE_COUNT; i++) {
        CHECKF(dt->names[i] && !strcmp(dt->names[i], kv_cache_dtype_name((kv_cache_dtype)i)), "dtype %d", i);
        kv_cache_dtype d;
        CHECK(kv_cache_dtype_from_name(dt->names[i], &d) == 0 && (int)d == i);
    }
    CHECK(dt->names[KV_CACHE_DTYPE_COUNT] == NULL);
}

static void test_validate(void) {
    kv_config c;
    kv_err err;
    static const struct {
        const char *set, *needle;
    } cases[] = {
        {"scheduler.preemption=swap", "kv.swap_memory: scheduler.preemption is swap"},
        {"workload.rate=0", "workload.rate: must be > 0 for poisson"},
        {"scheduler.max_seq_len=100", "exceeds scheduler.max_seq_len (100)"},
        {"workload.system_prompt_len=5000", NULL},
    };
    for (size_t i = 0; i < KV_ARRAY_LEN(cases); i++) {
        kv_config_default(&c);
        CHECK(kv_profile_set(&c, cases[i].set, &err) == 0);
        int rc = kv_config_validate(&c, &err);
        if (cases[i].needle) CHECKF(rc == KV_ERR_INVAL && strstr(err.msg, cases[i].needle), "%s: %s", cases[i].set, err.msg);
        else CHECKF(rc == 0, "%s: %s", cases[i].set, err.msg);
    }
    /* Raw values the parser would never produce are caught too. */
    kv_config_default(&c);
    c.kv.block_size = 0;
    CHECK(kv_config_validate(&c, &err) == KV_ERR_INVAL && strstr(err.msg, "kv.block_size: must be in [1, 1024]"));
    kv_config_default(&c);
    c.kv.layout = (kv_layout)7;
    CHECK(kv_config_validate(&c, &err) == KV_ERR_INVAL && strstr(err.msg, "kv.layout"));
    kv_config_default(&c);
    c.sampling.top_p = NAN;
    CHECK(kv_config_validate(&c, &err) == KV_ERR_INVAL && strstr(err.msg, "sampling.top_p"));
    kv_config_default(&c);
    c.kv.prefix_sharing = 2;
    CHECK(kv_config_validate(&c, &err) == KV_ERR_INVAL && strstr(err.msg, "kv.prefix_sharing"));
    kv_config_default(&c);
    memset(c.backend, 'x', sizeof c.backend);
    CHECK(kv_config_validate(&c, &err) == KV_ERR_INVAL && strstr(err.msg, "backend"));
    kv_config_default(&c);
    c.workload.prompt_len.kind = KV_DIST_UNIFORM;
    c.workload.prompt_len.min = 50;
    c.workload.prompt_len.max = 40;
    CHECK(kv_config_validate(&c, &err) == KV_ERR_INVAL && strstr(err.msg, "workload.prompt_len.min"));
    CHECK(kv_config_validate(NULL, &err) == KV_ERR_INVAL);
}

static void test_print_keys(void) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    REQUIRE(f);
    kv_profile_print_keys(f);
    fclose(f);
    int n;
    const kv_config_key *keys = kv_config_keys(&n);
    for (int i = 0; i < n; i++) CHECKF(strstr(text, keys[i].path) != NULL, "%s missing", keys[i].path);
    CHECK(strstr(text, "kv.block_size") && strstr(text, "integer in [1, 1024] (default 16)"));
    CHECK(strstr(text, "one of f32|f16|int8|int8_asym|fp8_e4m3|fp8_e5m2 (default f16)"));
    CHECK(strstr(text, "(default 256MiB)"));
    free(text);
}

TEST_MAIN(T(test_defaults_valid), T(test_shipped_profiles_load), T(test_values_parse), T(test_load_errors),
          T(test_sizes), T(test_set), T(test_load_with_sets), T(test_dump_roundtrip), T(test_key_table),
          T(test_validate), T(test_print_keys))
