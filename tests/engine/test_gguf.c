/* test_gguf.c - GGUF reader/writer: round trips of every value type, nested
 * and string arrays, tensors and alignments; the real stories260K file;
 * truncation at every prefix; corrupted counts, offsets, types, alignments.
 * Corruptions patch bytes found by searching for known names in a file the
 * writer produced, so the tests do not hard-code layouts. */
#include "../harness.h"

#include <stdint.h>
#include <unistd.h>

#include "../../engine/gguf.h"

/* ---- helpers ---------------------------------------------------------- */

static const char *tmp_path(const char *tag) { return harness_tmp_path("gguf", tag, ".gguf"); }

/* Position of the first occurrence of the GGUF string s (its 8-byte length
 * followed by the bytes), i.e. where its length field starts; -1 if none. */
static long find_gstr(const unsigned char *b, size_t n, const char *s) {
    size_t l = strlen(s);
    uint64_t len = l;
    for (size_t i = 0; i + 8 + l <= n; i++)
        if (!memcmp(b + i, &len, 8) && !memcmp(b + i + 8, s, l)) return (long)i;
    return -1;
}

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }

static float frand(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
}

/* Growable byte buffer to hand-encode nested values for add_raw. */
typedef struct enc {
    unsigned char b[4096];
    size_t n;
} enc;
static void e_u32(enc *e, uint32_t v) { memcpy(e->b + e->n, &v, 4); e->n += 4; }
static void e_u64(enc *e, uint64_t v) { memcpy(e->b + e->n, &v, 8); e->n += 8; }
static void e_str(enc *e, const char *s) {
    e_u64(e, strlen(s));
    memcpy(e->b + e->n, s, strlen(s));
    e->n += strlen(s);
}

/* ---- a file with every value type ----------------------------------- */

static const char *const g_strs[] = {"alpha", "", "\xe2\x96\x81hello", "with\nnewline", "z"};
static const uint64_t g_strs_lens[] = {5, 0, 8, 12, 1};

static float t_f32[7];
static uint16_t t_f16[4 * 3];
static unsigned char t_q8[2 * 34];
static unsigned char t_q4[3 * 2 * 18];
static uint16_t t_bf16[2 * 2 * 2 * 2];
static unsigned char t_q4k[144];

static void fill_tensor_data(void) {
    uint32_t s = 12345;
    for (size_t i = 0; i < KV_ARRAY_LEN(t_f32); i++) t_f32[i] = frand(&s);
    for (size_t i = 0; i < KV_ARRAY_LEN(t_f16); i++) t_f16[i] = kv_fp32_to_fp16(frand(&s));
    for (size_t i = 0; i < sizeof t_q8; i++) t_q8[i] = (unsigned char)(s = s * 1103515245u + 12345u) >> 3;
    for (size_t i = 0; i < sizeof t_q4; i++) t_q4[i] = (unsigned char)((s = s * 1103515245u + 12345u) >> 7);
    for (size_t i = 0; i < KV_ARRAY_LEN(t_bf16); i++) t_bf16[i] = kv_fp32_to_bf16(frand(&s));
    for (size_t i = 0; i < sizeof t_q4k; i++) t_q4k[i] = (unsigned char)((s = s * 1103515245u + 12345u) >> 11);
}

/* Adds every scalar type, numeric arrays of every fixed type, string
 * arrays, nested arrays, and six tensors. */
static void build_full(kv_gguf_writer *w) {
    uint8_t u8 = 250;
    int8_t i8 = -7;
    uint16_t u16 = 65000;
    int16_t i16 = -30000;
    int64_t i64 = -((int64_t)1 << 40);
    double f64 = 3.141592653589793;
    CHECK(kv_gguf_writer_add_scalar(w, "s.u8", KV_GGUF_UINT8, &u8) == 0);
    CHECK(kv_gguf_writer_add_scalar(w, "s.i8", KV_GGUF_INT8, &i8) == 0);
    CHECK(kv_gguf_writer_add_scalar(w, "s.u16", KV_GGUF_UINT16, &u16) == 0);
    CHECK(kv_gguf_writer_add_scalar(w, "s.i16", KV_GGUF_INT16, &i16) == 0);
    CHECK(kv_gguf_writer_add_u32(w, "s.u32", 4000000000u) == 0);
    CHECK(kv_gguf_writer_add_i32(w, "s.i32", -123456) == 0);
    CHECK(kv_gguf_writer_add_f32(w, "s.f32", 1e-5f) == 0);
    CHECK(kv_gguf_writer_add_bool(w, "s.bool", 1) == 0);
    CHECK(kv_gguf_writer_add_bool(w, "s.bool0", 0) == 0);
    CHECK(kv_gguf_writer_add_str(w, "s.str", "llama") == 0);
    CHECK(kv_gguf_writer_add_str(w, "s.empty", "") == 0);
    CHECK(kv_gguf_writer_add_u64(w, "s.u64", 18000000000000000000ull) == 0);
    CHECK(kv_gguf_writer_add_scalar(w, "s.i64", KV_GGUF_INT64, &i64) == 0);
    CHECK(kv_gguf_writer_add_scalar(w, "s.f64", KV_GGUF_FLOAT64, &f64) == 0);

    uint8_t a_u8[] = {0, 1, 255};
    int8_t a_i8[] = {-128, 0, 127};
    uint16_t a_u16[] = {1, 65535};
    int16_t a_i16[] = {-32768, 32767};
    uint32_t a_u32[] = {7, 8, 9, 4294967295u};
    int32_t a_i32[] = {-1, 2, -3};
    float a_f32[] = {0.5f, -1.25f, 1e30f};
    uint8_t a_bool[] = {1, 0, 1, 1};
    uint64_t a_u64[] = {0, 18446744073709551615ull};
    int64_t a_i64[] = {INT64_MIN, INT64_MAX};
    double a_f64[] = {-0.1, 2.5e-300};
    const struct {
        const char *key;
        kv_gguf_vtype type;
        const void *data;
        uint64_t n;
    } arrays[] = {
        {"a.u8", KV_GGUF_UINT8, a_u8, 3},      {"a.i8", KV_GGUF_INT8, a_i8, 3},
        {"a.u16", KV_GGUF_UINT16, a_u16, 2},   {"a.i16", KV_GGUF_INT16, a_i16, 2},
        {"a.u32", KV_GGUF_UINT32, a_u32, 4},   {"a.i32", KV_GGUF_INT32, a_i32, 3},
        {"a.f32", KV_GGUF_FLOAT32, a_f32, 3},  {"a.bool", KV_GGUF_BOOL, a_bool, 4},
        {"a.u64", KV_GGUF_UINT64, a_u64, 2},   {"a.i64", KV_GGUF_INT64, a_i64, 2},
        {"a.f64", KV_GGUF_FLOAT64, a_f64, 2},  {"a.empty", KV_GGUF_UINT32, NULL, 0},
    };
    for (size_t i = 0; i < KV_ARRAY_LEN(arrays); i++)
        CHECKF(kv_gguf_writer_add_arr(w, arrays[i].key, arrays[i].type, arrays[i].data, arrays[i].n) == 0, "%s",
               arrays[i].key);
    CHECK(kv_gguf_writer_add_arr_str(w, "a.str", g_strs, g_strs_lens, 5) == 0);
    const char *nul_str[] = {"a\0b", "cd"};
    const uint64_t nul_lens[] = {3, 2};
    CHECK(kv_gguf_writer_add_arr_str(w, "a.strnul", nul_str, nul_lens, 2) == 0);

    /* [[1,2],[3]] as u32 arrays */
    enc e = {.n = 0};
    e_u32(&e, KV_GGUF_ARRAY), e_u64(&e, 2);
    e_u32(&e, KV_GGUF_UINT32), e_u64(&e, 2), e_u32(&e, 1), e_u32(&e, 2);
    e_u32(&e, KV_GGUF_UINT32), e_u64(&e, 1), e_u32(&e, 3);
    CHECK(kv_gguf_writer_add_raw(w, "n.u32", KV_GGUF_ARRAY, e.b, e.n) == 0);
    /* [["x","yy"],[]] as string arrays */
    e.n = 0;
    e_u32(&e, KV_GGUF_ARRAY), e_u64(&e, 2);
    e_u32(&e, KV_GGUF_STRING), e_u64(&e, 2), e_str(&e, "x"), e_str(&e, "yy");
    e_u32(&e, KV_GGUF_STRING), e_u64(&e, 0);
    CHECK(kv_gguf_writer_add_raw(w, "n.str", KV_GGUF_ARRAY, e.b, e.n) == 0);
    /* [[[5]]] three levels */
    e.n = 0;
    e_u32(&e, KV_GGUF_ARRAY), e_u64(&e, 1);
    e_u32(&e, KV_GGUF_ARRAY), e_u64(&e, 1);
    e_u32(&e, KV_GGUF_INT32), e_u64(&e, 1), e_u32(&e, 5);
    CHECK(kv_gguf_writer_add_raw(w, "n.deep", KV_GGUF_ARRAY, e.b, e.n) == 0);

    int64_t ne_f32[] = {7}, ne_f16[] = {4, 3}, ne_q8[] = {64, 1}, ne_q4[] = {32, 3, 2}, ne_bf[] = {2, 2, 2, 2},
            ne_q4k[] = {256};
    CHECK(kv_gguf_writer_add_tensor(w, "t.f32", KV_TYPE_F32, 1, ne_f32, t_f32, sizeof t_f32) == 0);
    CHECK(kv_gguf_writer_add_tensor(w, "t.f16", KV_TYPE_F16, 2, ne_f16, t_f16, sizeof t_f16) == 0);
    CHECK(kv_gguf_writer_add_tensor_ref(w, "t.q8_0", KV_TYPE_Q8_0, 2, ne_q8, t_q8, sizeof t_q8) == 0);
    CHECK(kv_gguf_writer_add_tensor(w, "t.q4_0", KV_TYPE_Q4_0, 3, ne_q4, t_q4, sizeof t_q4) == 0);
    CHECK(kv_gguf_writer_add_tensor(w, "t.bf16", KV_TYPE_BF16, 4, ne_bf, t_bf16, sizeof t_bf16) == 0);
    CHECK(kv_gguf_writer_add_tensor(w, "t.q4_k", KV_TYPE_Q4_K, 1, ne_q4k, t_q4k, sizeof t_q4k) == 0);
}

static void check_full(const kv_gguf *g) {
    kv_err err;
    uint64_t u64;
    int64_t i64;
    uint32_t u32;
    float f;
    int b;
    kv_gguf_str s;
    CHECK(kv_gguf_version(g) == 3);
    CHECK(kv_gguf_n_kv(g) == 31);
    CHECK(kv_gguf_get_u64(g, "s.u8", &u64, &err) == 0 && u64 == 250);
    CHECK(kv_gguf_get_i64(g, "s.i8", &i64, &err) == 0 && i64 == -7);
    CHECK(kv_gguf_get_u32(g, "s.u16", &u32, &err) == 0 && u32 == 65000);
    CHECK(kv_gguf_get_i64(g, "s.i16", &i64, &err) == 0 && i64 == -30000);
    CHECK(kv_gguf_get_u32(g, "s.u32", &u32, &err) == 0 && u32 == 4000000000u);
    CHECK(kv_gguf_get_i64(g, "s.i32", &i64, &err) == 0 && i64 == -123456);
    CHECK(kv_gguf_get_f32(g, "s.f32", &f, &err) == 0 && f == 1e-5f);
    CHECK(kv_gguf_get_bool(g, "s.bool", &b, &err) == 0 && b == 1);
    CHECK(kv_gguf_get_bool(g, "s.bool0", &b, &err) == 0 && b == 0);
    CHECK(kv_gguf_get_str(g, "s.str", &s, &err) == 0 && kv_gguf_str_eq(s, "llama"));
    CHECK(kv_gguf_get_str(g, "s.empty", &s, &err) == 0 && s.len == 0 && kv_gguf_str_eq(s, ""));
    CHECK(kv_gguf_get_u64(g, "s.u64", &u64, &err) == 0 && u64 == 18000000000000000000ull);
    CHECK(kv_gguf_get_i64(g, "s.i64", &i64, &err) == 0 && i64 == -((int64_t)1 << 40));
    CHECK(kv_gguf_get_f32(g, "s.f64", &f, &err) == 0 && f == (float)3.141592653589793);
    CHECK(kv_gguf_type_at(g, kv_gguf_find_key(g, "s.f64")) == KV_GGUF_FLOAT64);
    CHECK(kv_gguf_type_at(g, kv_gguf_find_key(g, "s.i16")) == KV_GGUF_INT16);
    CHECK(kv_gguf_type_at(g, kv_gguf_find_key(g, "s.u8")) == KV_GGUF_UINT8);
    CHECK(kv_gguf_type_at(g, kv_gguf_find_key(g, "s.i8")) == KV_GGUF_INT8);

    /* key order is file order */
    CHECK(kv_gguf_str_eq(kv_gguf_key_at(g, 0), "s.u8"));
    CHECK(kv_gguf_str_eq(kv_gguf_key_at(g, 30), "n.deep"));
    CHECK(kv_gguf_key_at(g, 31).data == NULL);
    CHECK((int)kv_gguf_type_at(g, 31) == -1);

    kv_gguf_vtype et;
    uint64_t n;
    CHECK(kv_gguf_get_arr(g, "a.u8", &et, &n, &err) == 0 && et == KV_GGUF_UINT8 && n == 3);
    CHECK(kv_gguf_arr_i64(g, "a.u8", 2) == 255);
    CHECK(kv_gguf_arr_i64(g, "a.i8", 0) == -128 && kv_gguf_arr_i64(g, "a.i8", 2) == 127);
    CHECK(kv_gguf_arr_i64(g, "a.u16", 1) == 65535);
    CHECK(kv_gguf_arr_i64(g, "a.i16", 0) == -32768);
    CHECK(kv_gguf_arr_i64(g, "a.u32", 3) == 4294967295ll);
    CHECK(kv_gguf_arr_i64(g, "a.i32", 2) == -3);
    CHECK(kv_gguf_arr_f64(g, "a.f32", 1) == -1.25);
    CHECK(kv_gguf_arr_i64(g, "a.f32", 1) == -1); /* truncates toward zero */
    CHECK(kv_gguf_arr_i64(g, "a.f32", 2) == 0);  /* 1e30 does not fit */
    CHECK(kv_gguf_arr_i64(g, "a.bool", 0) == 1 && kv_gguf_arr_i64(g, "a.bool", 1) == 0);
    CHECK(kv_gguf_arr_f64(g, "a.u64", 1) == 18446744073709551615.0);
    CHECK(kv_gguf_arr_i64(g, "a.u64", 1) == 0); /* does not fit int64 */
    CHECK(kv_gguf_arr_i64(g, "a.i64", 0) == INT64_MIN && kv_gguf_arr_i64(g, "a.i64", 1) == INT64_MAX);
    CHECK(kv_gguf_arr_f64(g, "a.f64", 1) == 2.5e-300);
    CHECK(kv_gguf_arr_f64(g, "a.f64", 2) == 0); /* out of range */
    CHECK(kv_gguf_get_arr(g, "a.empty", &et, &n, &err) == 0 && et == KV_GGUF_UINT32 && n == 0);
    const void *raw = kv_gguf_arr_data(g, "a.u32");
    REQUIRE(raw != NULL);
    uint32_t r2;
    memcpy(&r2, (const char *)raw + 4, 4);
    CHECK(r2 == 8);
    CHECK(kv_gguf_arr_data(g, "a.str") == NULL);
    CHECK(kv_gguf_arr_data(g, "s.u32") == NULL);

    CHECK(kv_gguf_get_arr(g, "a.str", &et, &n, &err) == 0 && et == KV_GGUF_STRING && n == 5);
    for (uint64_t i = 0; i < 5; i++) {
        kv_gguf_str e = kv_gguf_arr_str(g, "a.str", i);
        CHECK(e.len == g_strs_lens[i] && (e.len == 0 || !memcmp(e.data, g_strs[i], e.len)));
    }
    CHECK(kv_gguf_arr_str(g, "a.str", 5).data == NULL);
    CHECK(kv_gguf_arr_str(g, "a.u32", 0).data == NULL);
    kv_gguf_str sn = kv_gguf_arr_str(g, "a.strnul", 0);
    CHECK(sn.len == 3 && !memcmp(sn.data, "a\0b", 3));

    CHECK(kv_gguf_get_arr(g, "n.u32", &et, &n, &err) == 0 && et == KV_GGUF_ARRAY && n == 2);
    CHECK(kv_gguf_get_arr(g, "n.str", &et, &n, &err) == 0 && et == KV_GGUF_ARRAY && n == 2);
    CHECK(kv_gguf_arr_f64(g, "n.u32", 0) == 0); /* not numeric */

    /* formatting */
    static const char *const formats[][2] = {
        {"n.u32", "[array x 2] [u32 x 2: 1, 2], [u32 x 1: 3]"},
        {"n.str", "[array x 2] [string x 2: \"x\", \"yy\"], [string x 0: ]"},
        {"n.deep", "[array x 1] [array x 1: [i32 x 1: 5]]"},
        {"a.str", "[string x 5] \"alpha\", \"\", \"\xe2\x96\x81hello\", \"with\\nnewline\", \"z\""},
        {"s.i16", "-30000"},
        {"s.u64", "18000000000000000000"},
        {"s.bool", "true"},
        {"s.f64", "3.1415926535897931"},
        {"a.strnul", "[string x 2] \"a\\x00b\", \"cd\""},
    };
    char buf[256];
    for (size_t i = 0; i < KV_ARRAY_LEN(formats); i++) {
        kv_gguf_format_value(g, kv_gguf_find_key(g, formats[i][0]), buf, sizeof buf);
        CHECKF(!strcmp(buf, formats[i][1]), "%s: got %s", formats[i][0], buf);
    }
    /* truncation keeps NUL-termination and marks the cut */
    char small[12];
    kv_gguf_format_value(g, kv_gguf_find_key(g, "a.str"), small, sizeof small);
    CHECKF(strlen(small) == 11 && !strcmp(small + 8, "..."), "got %s", small);
    char tiny[2] = {'x', 'x'};
    kv_gguf_format_value(g, kv_gguf_find_key(g, "a.str"), tiny, 1);
    CHECK(tiny[0] == '\0' && tiny[1] == 'x');

    /* tensors */
    CHECK(kv_gguf_n_tensors(g) == 6);
    struct {
        const char *name;
        kv_type type;
        int nd;
        int64_t ne[4];
        const void *data;
        size_t size;
    } want[] = {
        {"t.f32", KV_TYPE_F32, 1, {7, 1, 1, 1}, t_f32, sizeof t_f32},
        {"t.f16", KV_TYPE_F16, 2, {4, 3, 1, 1}, t_f16, sizeof t_f16},
        {"t.q8_0", KV_TYPE_Q8_0, 2, {64, 1, 1, 1}, t_q8, sizeof t_q8},
        {"t.q4_0", KV_TYPE_Q4_0, 3, {32, 3, 2, 1}, t_q4, sizeof t_q4},
        {"t.bf16", KV_TYPE_BF16, 4, {2, 2, 2, 2}, t_bf16, sizeof t_bf16},
        {"t.q4_k", KV_TYPE_Q4_K, 1, {256, 1, 1, 1}, t_q4k, sizeof t_q4k},
    };
    for (int i = 0; i < 6; i++) {
        const kv_gguf_tensor *t = kv_gguf_tensor_at(g, i);
        REQUIRE(t);
        CHECKF(kv_gguf_str_eq(t->name, want[i].name), "tensor %d", i);
        CHECK(kv_gguf_find_tensor(g, want[i].name) == t);
        CHECK(t->type == want[i].type && t->n_dims == want[i].nd);
        CHECK(!memcmp(t->ne, want[i].ne, sizeof t->ne));
        CHECK(t->size == want[i].size);
        CHECK(t->offset % 32 == 0);
        CHECK(((const unsigned char *)t->data - (const unsigned char *)t->data + t->offset) == t->offset);
        CHECK(!memcmp(t->data, want[i].data, want[i].size));
    }
    CHECK(kv_gguf_tensor_at(g, 6) == NULL && kv_gguf_tensor_at(g, -1) == NULL);
    CHECK(kv_gguf_find_tensor(g, "t.nope") == NULL);
    CHECK(kv_gguf_data_offset(g) % 32 == 0);
}

static void test_roundtrip_all_types(void) {
    fill_tensor_data();
    kv_gguf_writer *w = kv_gguf_writer_new();
    REQUIRE(w);
    build_full(w);
    kv_err err = {0};
    const char *p = tmp_path("full");
    CHECKF(kv_gguf_writer_write(w, p, &err) == 0, "%s", err.msg);
    kv_gguf_writer_free(w);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    CHECK(access(tmp, F_OK) != 0); /* renamed away */

    kv_gguf *g = kv_gguf_open(p, &err);
    CHECKF(g != NULL, "%s", err.msg);
    if (g) {
        check_full(g);
        CHECK(kv_gguf_file_size(g) > 0 && kv_gguf_alignment(g) == 32);
        CHECK(!strcmp(kv_gguf_name(g), p));
    }
    kv_gguf_close(g);

    /* the same bytes through a caller buffer, and as GGUF v2 */
    size_t n;
    unsigned char *b = harness_read_file(p, &n);
    REQUIRE(b);
    g = kv_gguf_open_mem(b, n, &err);
    CHECKF(g != NULL, "%s", err.msg);
    if (g) check_full(g);
    kv_gguf_close(g);
    put_u32(b + 4, 2);
    g = kv_gguf_open_mem(b, n, &err);
    CHECKF(g != NULL && kv_gguf_version(g) == 2, "%s", err.msg);
    kv_gguf_close(g);
    free(b);
    unlink(p);
}

/* ---- alignment ---------------------------------------------------------- */

static void test_alignment(void) {
    const uint32_t aligns[] = {1, 8, 64, 4096};
    for (size_t k = 0; k < KV_ARRAY_LEN(aligns); k++) {
        kv_gguf_writer *w = kv_gguf_writer_new();
        REQUIRE(w);
        CHECK(kv_gguf_writer_add_str(w, "general.architecture", "llama") == 0);
        CHECK(kv_gguf_writer_set_alignment(w, aligns[k]) == 0);
        float a[3] = {1, 2, 3}, b[5] = {4, 5, 6, 7, 8};
        int64_t na[] = {3}, nb[] = {5};
        CHECK(kv_gguf_writer_add_tensor(w, "a", KV_TYPE_F32, 1, na, a, sizeof a) == 0);
        CHECK(kv_gguf_writer_add_tensor(w, "b", KV_TYPE_F32, 1, nb, b, sizeof b) == 0);
        kv_err err;
        const char *p = tmp_path("align");
        CHECKF(kv_gguf_writer_write(w, p, &err) == 0, "%s", err.msg);
        kv_gguf_writer_free(w);
        size_t n;
        unsigned char *buf = harness_read_file(p, &n);
        REQUIRE(buf);
        kv_gguf *g = kv_gguf_open_mem(buf, n, &err);
        CHECKF(g != NULL, "align %u: %s", aligns[k], err.msg);
        if (g) {
            CHECK(kv_gguf_alignment(g) == aligns[k]);
            CHECK(kv_gguf_data_offset(g) % aligns[k] == 0);
            uint32_t av;
            int rc = kv_gguf_get_u32(g, "general.alignment", &av, &err);
            /* written only when it is not the default */
            CHECK(aligns[k] == 32 ? rc == 1 : (rc == 0 && av == aligns[k]));
            const kv_gguf_tensor *tb = kv_gguf_find_tensor(g, "b");
            REQUIRE(tb);
            CHECK(((size_t)((const unsigned char *)tb->data - buf)) % aligns[k] == 0);
            CHECK(tb->offset == (aligns[k] >= 12 ? aligns[k] : ((12 + aligns[k] - 1) / aligns[k]) * aligns[k]));
            CHECK(!memcmp(tb->data, b, sizeof b));
        }
        kv_gguf_close(g);
        free(buf);
        unlink(p);
    }
    kv_gguf_writer *w = kv_gguf_writer_new();
    CHECK(kv_gguf_writer_set_alignment(w, 48) == KV_ERR_INVAL);
    CHECK(kv_gguf_writer_set_alignment(w, 0) == KV_ERR_INVAL);
    kv_gguf_writer_free(w);
    /* alignment given as a key works the same */
    w = kv_gguf_writer_new();
    CHECK(kv_gguf_writer_add_u32(w, "general.alignment", 16) == 0);
    CHECK(kv_gguf_writer_set_alignment(w, 128) == 0); /* updates the key in place */
    float a[1] = {1};
    int64_t na[] = {1};
    CHECK(kv_gguf_writer_add_tensor(w, "a", KV_TYPE_F32, 1, na, a, 4) == 0);
    kv_err err;
    const char *p = tmp_path("align2");
    CHECK(kv_gguf_writer_write(w, p, &err) == 0);
    kv_gguf_writer_free(w);
    kv_gguf *g = kv_gguf_open(p, &err);
    CHECK(g && kv_gguf_alignment(g) == 128 && kv_gguf_n_kv(g) == 1 && kv_gguf_data_offset(g) == 128);
    kv_gguf_close(g);
    unlink(p);
}

/* ---- the real file ---------------------------------------------------- */

static void test_stories260k(void) {
    kv_err err;
    kv_gguf *g = kv_gguf_open(harness_shared_path("models/stories260K.gguf"), &err);
    CHECKF(g != NULL, "%s", err.msg);
    if (!g) return;
    CHECK(kv_gguf_version(g) == 3);
    CHECK(kv_gguf_n_tensors(g) == 48);
    CHECK(kv_gguf_alignment(g) == 32);
    CHECK(kv_gguf_file_size(g) == 1185376);
    uint32_t v;
    CHECK(kv_gguf_get_u32(g, "llama.embedding_length", &v, &err) == 0 && v == 64);
    CHECK(kv_gguf_get_u32(g, "llama.feed_forward_length", &v, &err) == 0 && v == 172);
    CHECK(kv_gguf_get_u32(g, "llama.block_count", &v, &err) == 0 && v == 5);
    CHECK(kv_gguf_get_u32(g, "llama.attention.head_count_kv", &v, &err) == 0 && v == 4);
    float eps;
    CHECK(kv_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps, &err) == 0 && eps == 1e-5f);
    CHECK(kv_gguf_get_f32(g, "llama.rope.freq_base", &eps, &err) == 1);
    kv_gguf_str s;
    CHECK(kv_gguf_get_str(g, "general.architecture", &s, &err) == 0 && kv_gguf_str_eq(s, "llama"));
    CHECK(kv_gguf_get_str(g, "tokenizer.ggml.model", &s, &err) == 0 && kv_gguf_str_eq(s, "llama"));
    kv_gguf_vtype et;
    uint64_t n;
    CHECK(kv_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &err) == 0 && et == KV_GGUF_STRING && n == 512);
    CHECK(kv_gguf_str_eq(kv_gguf_arr_str(g, "tokenizer.ggml.tokens", 0), "<unk>"));
    CHECK(kv_gguf_str_eq(kv_gguf_arr_str(g, "tokenizer.ggml.tokens", 1), "<s>"));
    CHECK(kv_gguf_str_eq(kv_gguf_arr_str(g, "tokenizer.ggml.tokens", 3), "<0x00>"));
    CHECK(kv_gguf_str_eq(kv_gguf_arr_str(g, "tokenizer.ggml.tokens", 258), "<0xFF>"));
    CHECK(kv_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, &err) == 0 && et == KV_GGUF_INT32 && n == 512);
    CHECK(kv_gguf_arr_i64(g, "tokenizer.ggml.token_type", 0) == 2);
    CHECK(kv_gguf_arr_i64(g, "tokenizer.ggml.token_type", 1) == 3);
    CHECK(kv_gguf_arr_i64(g, "tokenizer.ggml.token_type", 100) == 6);
    CHECK(kv_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n, &err) == 0 && et == KV_GGUF_FLOAT32 && n == 512);
    const kv_gguf_tensor *t = kv_gguf_find_tensor(g, "token_embd.weight");
    REQUIRE(t);
    CHECK(t->type == KV_TYPE_F32 && t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 512);
    CHECK(t->offset == 0 && t->size == 64 * 512 * 4);
    t = kv_gguf_find_tensor(g, "blk.4.ffn_down.weight");
    REQUIRE(t);
    CHECK(t->ne[0] == 172 && t->ne[1] == 64);
    t = kv_gguf_find_tensor(g, "output.weight");
    const kv_gguf_tensor *e = kv_gguf_find_tensor(g, "token_embd.weight");
    REQUIRE(t && e);
    CHECK(t->size == e->size && !memcmp(t->data, e->data, e->size)); /* README: a copy of the embedding */
    /* every tensor in bounds and F32 */
    int all = 1;
    for (int64_t i = 0; i < kv_gguf_n_tensors(g); i++) {
        const kv_gguf_tensor *ti = kv_gguf_tensor_at(g, i);
        all &= ti->type == KV_TYPE_F32;
        all &= kv_gguf_data_offset(g) + ti->offset + ti->size <= kv_gguf_file_size(g);
    }
    CHECK(all);
    char buf[128];
    kv_gguf_format_value(g, kv_gguf_find_key(g, "tokenizer.ggml.tokens"), buf, sizeof buf);
    CHECKF(!strncmp(buf, "[string x 512] \"<unk>\", \"<s>\", \"</s>\", \"<0x00>\"", 46), "got %s", buf);
    CHECK(!strcmp(buf + strlen(buf) - 3, "..."));
    kv_gguf_close(g);
}

/* ---- a small file for truncation and corruption ----------------------- */

/* Writes a small file whose last tensor ends exactly at a 32-byte boundary,
 * so every strict prefix is missing something. Returns the bytes. */
static unsigned char *small_file(size_t *n) {
    const char *toks[] = {"<unk>", "a", "bc"};
    uint32_t ids[] = {1, 2, 3};
    enc e = {.n = 0};
    e_u32(&e, KV_GGUF_ARRAY), e_u64(&e, 1); /* [["q"]] */
    e_u32(&e, KV_GGUF_STRING), e_u64(&e, 1), e_str(&e, "q");
    uint8_t x = 3;
    float f[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    unsigned char q8[34];
    for (size_t i = 0; i < sizeof q8; i++) q8[i] = (unsigned char)(i * 7);
    int64_t nf[] = {8};
    kv_gguf_writer *w = kv_gguf_writer_new();
    if (!w) return NULL;
    kv_gguf_writer_add_str(w, "general.architecture", "llama");
    kv_gguf_writer_add_u32(w, "general.alignment", 32);
    kv_gguf_writer_add_u32(w, "llama.block_count", 2);
    kv_gguf_writer_add_bool(w, "flag", 1);
    kv_gguf_writer_add_arr_str(w, "tok", toks, NULL, 3);
    kv_gguf_writer_add_arr(w, "ids", KV_GGUF_UINT32, ids, 3);
    kv_gguf_writer_add_raw(w, "nest", KV_GGUF_ARRAY, e.b, e.n);
    kv_gguf_writer_add_scalar(w, "u8", KV_GGUF_UINT8, &x);
    int64_t nq1[] = {32, 1}, nq2[] = {64, 1};
    unsigned char q4[18 * 2];
    for (size_t i = 0; i < sizeof q4; i++) q4[i] = (unsigned char)(i * 5 + 1);
    kv_gguf_writer_add_tensor(w, "ta", KV_TYPE_F32, 1, nf, f, sizeof f);            /* 32 bytes */
    kv_gguf_writer_add_tensor(w, "tb", KV_TYPE_Q8_0, 2, nq1, q8, 34);               /* 34 -> pad 64 */
    kv_gguf_writer_add_tensor(w, "tc", KV_TYPE_Q4_0, 2, nq2, q4, sizeof q4);        /* 36 -> pad 64 */
    kv_gguf_writer_add_tensor(w, "td", KV_TYPE_F32, 1, nf, f, sizeof f);            /* 32: ends aligned */
    kv_err err;
    const char *p = tmp_path("small");
    int rc = kv_gguf_writer_write(w, p, &err);
    kv_gguf_writer_free(w);
    if (rc) {
        fprintf(stderr, "  small_file: %s\n", err.msg);
        return NULL;
    }
    unsigned char *b = harness_read_file(p, n);
    unlink(p);
    return b;
}

static void test_truncation_every_prefix(void) {
    size_t n;
    unsigned char *b = small_file(&n);
    REQUIRE(b);
    kv_err err;
    kv_gguf *g = kv_gguf_open_mem(b, n, &err);
    CHECKF(g != NULL, "%s", err.msg);
    REQUIRE(g);
    const kv_gguf_tensor *td = kv_gguf_find_tensor(g, "td");
    REQUIRE(td);
    CHECK(kv_gguf_data_offset(g) + td->offset + td->size == n); /* no trailing padding */
    kv_gguf_close(g);
    int bad = 0;
    for (size_t len = 0; len < n; len++) {
        /* a fresh heap copy of exactly len bytes, so ASan catches any read past it */
        unsigned char *c = malloc(len ? len : 1);
        memcpy(c, b, len);
        kv_err_clear(&err);
        g = kv_gguf_open_mem(c, len, &err);
        if (g || err.code == 0 || err.msg[0] == '\0') {
            if (bad++ < 5) fprintf(stderr, "  prefix %zu/%zu opened or gave no message\n", len, n);
        }
        kv_gguf_close(g);
        free(c);
    }
    CHECKF(bad == 0, "%d prefixes", bad);
    /* through the mmap path too, at a few lengths */
    const size_t lens[] = {0, 3, 23, 24, 100, n / 2, n - 1};
    const char *p = tmp_path("trunc");
    for (size_t k = 0; k < KV_ARRAY_LEN(lens); k++) {
        REQUIRE(harness_write_file(p, b, lens[k]) == 0);
        g = kv_gguf_open(p, &err);
        CHECKF(g == NULL && err.code != 0 && strstr(err.msg, p), "len %zu: %s", lens[k], err.msg);
        kv_gguf_close(g);
    }
    unlink(p);
    free(b);
}

/* Opens a patched copy and checks it fails with code and every needle in
 * the message. */
static void expect_fail(const unsigned char *b, size_t n, int code, const char *n1, const char *n2, int line) {
    kv_err err;
    kv_err_clear(&err);
    kv_gguf *g = kv_gguf_open_mem(b, n, &err);
    if (g) {
        fprintf(stderr, "  line %d: opened a corrupted file\n", line);
        harness_cur_failures++;
        kv_gguf_close(g);
        return;
    }
    if (err.code != code || (n1 && !strstr(err.msg, n1)) || (n2 && !strstr(err.msg, n2))) {
        fprintf(stderr, "  line %d: code %d (want %d), message '%s' (want '%s', '%s')\n", line, err.code, code,
                err.msg, n1 ? n1 : "", n2 ? n2 : "");
        harness_cur_failures++;
    }
}
#define EXPECT_FAIL(b, n, code, n1, n2) expect_fail(b, n, code, n1, n2, __LINE__)

static void test_corruptions(void) {
    size_t n;
    unsigned char *orig = small_file(&n);
    REQUIRE(orig);
    unsigned char *b = malloc(n);
    REQUIRE(b);
#define RESET() memcpy(b, orig, n)
    char at[64];

    RESET(), b[0] = 'X';
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "not a GGUF file", "byte 0");
    RESET(), put_u32(b + 4, 1);
    EXPECT_FAIL(b, n, KV_ERR_UNSUPPORTED, "v1", NULL);
    RESET(), put_u32(b + 4, 4);
    EXPECT_FAIL(b, n, KV_ERR_UNSUPPORTED, "version 4", NULL);
    RESET(), put_u32(b + 4, 0x03000000u);
    EXPECT_FAIL(b, n, KV_ERR_UNSUPPORTED, "big-endian", NULL);
    RESET(), put_u64(b + 8, (uint64_t)1 << 63);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "tensor count 9223372036854775808", "byte 8");
    RESET(), put_u64(b + 16, (uint64_t)1 << 63);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "key count 9223372036854775808", "byte 16");
    RESET(), put_u64(b + 16, 100); /* fits the bound but runs into the tensor infos */
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, NULL, NULL);

    /* key "tok": string array count and element lengths */
    long k = find_gstr(orig, n, "tok");
    REQUIRE(k > 0);
    size_t arr = (size_t)k + 8 + 3 + 4; /* after name and type: elem type, count */
    snprintf(at, sizeof at, "byte %zu", arr + 12);
    RESET(), put_u64(b + arr + 4, (uint64_t)1 << 63);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "key 'tok'", "array of 9223372036854775808 string");
    RESET(), put_u64(b + arr + 4, 1000);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "key 'tok'", NULL);
    RESET(), put_u64(b + arr + 12, (uint64_t)-1); /* first string length */
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "key 'tok'", at);
    RESET(), put_u32(b + arr, 13); /* element type */
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "key 'tok'", "unknown element type 13");
    RESET(), put_u32(b + arr - 4, 42); /* value type */
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "key 'tok'", "unknown value type 42");
    RESET(), put_u64(b + k, (uint64_t)1 << 62); /* key length */
    snprintf(at, sizeof at, "byte %ld", k);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "key #4", at);

    /* numeric array count */
    k = find_gstr(orig, n, "ids");
    REQUIRE(k > 0);
    RESET(), put_u64(b + k + 8 + 3 + 4 + 4, (uint64_t)1 << 62);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "key 'ids'", "array of 4611686018427387904 u32");
    /* nested array: inner count */
    k = find_gstr(orig, n, "nest");
    REQUIRE(k > 0);
    RESET(), put_u64(b + k + 8 + 4 + 4 + 12 + 4, 99);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "key 'nest'", "array of 99 string");
    /* bool */
    k = find_gstr(orig, n, "flag");
    REQUIRE(k > 0);
    RESET(), b[k + 8 + 4 + 4] = 2;
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "key 'flag'", "bool value 2");
    /* duplicate key: rename "tok" to "ids" (same length) */
    RESET(), memcpy(b + find_gstr(orig, n, "tok") + 8, "ids", 3);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "duplicate key 'ids'", NULL);
    RESET(), b[find_gstr(orig, n, "tok") + 9] = '\0';
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "NUL byte", NULL);

    /* general.alignment */
    k = find_gstr(orig, n, "general.alignment");
    REQUIRE(k > 0);
    size_t av = (size_t)k + 8 + 17 + 4;
    RESET(), put_u32(b + av, 48);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "general.alignment", "not a power of two");
    RESET(), put_u32(b + av, 0);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "general.alignment", "not a power of two");
    RESET(), put_u32(b + av - 4, KV_GGUF_FLOAT32);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "general.alignment", "not an integer");
    RESET(), put_u32(b + av - 4, KV_GGUF_INT32), put_u32(b + av, (uint32_t)-32);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "general.alignment", "not a power of two");
    RESET(), put_u32(b + av, 64); /* valid, but the tensor offsets are no longer aligned */
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "tensor 'tb'", "alignment 64");
    RESET(), put_u32(b + av, 16); /* smaller alignment moves the data start: still valid offsets */
    {
        kv_err err;
        kv_gguf *g = kv_gguf_open_mem(b, n, &err);
        /* the data section start moves or not depending on layout; either opens with
         * offsets in range or fails naming a tensor: never crashes */
        if (!g) CHECKF(strstr(err.msg, "tensor '"), "%s", err.msg);
        kv_gguf_close(g);
    }

    /* tensor infos: name, n_dims, ne, type, offset */
    k = find_gstr(orig, n, "tb");
    REQUIRE(k > 0);
    size_t nd = (size_t)k + 8 + 2, ne0 = nd + 4, ty = nd + 4 + 16, off = ty + 4;
    RESET(), put_u32(b + ty, 99);
    snprintf(at, sizeof at, "byte %zu", ty);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "tensor 'tb': unknown type id 99", at);
    RESET(), put_u32(b + ty, 4); /* a retired GGML id (Q4_2) */
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "tensor 'tb'", "type id 4");
    RESET(), put_u32(b + ty, 0xffffffffu);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "tensor 'tb'", "type id 4294967295");
    RESET(), put_u32(b + nd, 0);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "tensor 'tb'", "n_dims 0");
    RESET(), put_u32(b + nd, 5);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "tensor 'tb'", "n_dims 5");
    RESET(), put_u64(b + ne0 + 8, 0);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "tensor 'tb'", "ne[1] = 0");
    RESET(), put_u64(b + ne0, 33);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "tensor 'tb'", "not a multiple of the q8_0 block size 32");
    RESET(), put_u64(b + ne0 + 8, (uint64_t)1 << 62);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "tensor 'tb'", "overflows");
    RESET(), put_u64(b + ne0 + 8, (uint64_t)-1);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "tensor 'tb'", "ne[1]");
    RESET(), put_u64(b + ne0 + 8, 3); /* data now runs into tc and td, and past the end? 3*34=102 */
    {
        kv_err err;
        kv_gguf *g = kv_gguf_open_mem(b, n, &err);
        CHECK(g != NULL); /* overlap is allowed: only the file bounds are checked */
        kv_gguf_close(g);
    }
    RESET(), put_u64(b + ne0 + 8, 1000);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "tensor 'tb'", "runs past the end");
    RESET(), put_u64(b + off, 16);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "tensor 'tb'", "not a multiple of the alignment 32");
    RESET(), put_u64(b + off, (uint64_t)-32);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "tensor 'tb'", "runs past the end");
    RESET(), put_u64(b + off, n);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "tensor 'tb'", "runs past the end");
    RESET(), memcpy(b + k + 8, "ta", 2);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "duplicate tensor 'ta'", NULL);
    RESET(), put_u64(b + k, 0);
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, NULL, NULL);
    RESET(), put_u64(b + 8, 5); /* one more tensor than there are infos */
    EXPECT_FAIL(b, n, KV_ERR_FORMAT, "tensor", NULL);
    RESET(), put_u64(b + 8, 3); /* one fewer: the 4th info is then read as padding and data */
    {
        kv_err err;
        kv_gguf *g = kv_gguf_open_mem(b, n, &err);
        if (!g) CHECK(err.code == KV_ERR_FORMAT);
        kv_gguf_close(g);
    }

    /* arrays nested deeper than the limit */
    {
        enc e = {.n = 0};
        for (int d = 0; d < 20; d++) e_u32(&e, KV_GGUF_ARRAY), e_u64(&e, 1);
        e_u32(&e, KV_GGUF_UINT8), e_u64(&e, 0);
        kv_gguf_writer *w = kv_gguf_writer_new();
        CHECK(kv_gguf_writer_add_raw(w, "deep", KV_GGUF_ARRAY, e.b, e.n) == KV_ERR_INVAL);
        kv_gguf_writer_free(w);
        unsigned char file[4096];
        size_t fn = 0;
        memcpy(file, "GGUF", 4), put_u32(file + 4, 3), put_u64(file + 8, 0), put_u64(file + 16, 1);
        fn = 24;
        put_u64(file + fn, 4), memcpy(file + fn + 8, "deep", 4), put_u32(file + fn + 12, KV_GGUF_ARRAY);
        fn += 16;
        memcpy(file + fn, e.b, e.n);
        fn += e.n;
        EXPECT_FAIL(file, fn, KV_ERR_FORMAT, "key 'deep'", "nested deeper than 16");
    }
    free(b);
    free(orig);
#undef RESET
}

/* ---- open errors, getters --------------------------------------------- */

static void test_open_errors(void) {
    kv_err err;
    const char *p = tmp_path("missing");
    unlink(p);
    CHECK(kv_gguf_open(p, &err) == NULL && err.code == KV_ERR_IO && strstr(err.msg, p));
    CHECK(kv_gguf_open(NULL, &err) == NULL && err.code == KV_ERR_INVAL);
    const char *dir = getenv("TMPDIR");
    CHECK(kv_gguf_open(dir && *dir ? dir : "/tmp", &err) == NULL && err.code == KV_ERR_IO);
    CHECK(kv_gguf_open_mem(NULL, 0, &err) == NULL && err.code != 0);
    CHECK(kv_gguf_open_mem(NULL, 10, &err) == NULL && err.code == KV_ERR_INVAL);
    REQUIRE(harness_write_file(p, "not a gguf file at all, but long enough", 39) == 0);
    CHECK(kv_gguf_open(p, &err) == NULL && err.code == KV_ERR_FORMAT && strstr(err.msg, "not a GGUF"));
    REQUIRE(harness_write_file(p, "NOPE", 4) == 0);
    CHECK(kv_gguf_open(p, &err) == NULL && err.code == KV_ERR_FORMAT && strstr(err.msg, "not a GGUF"));
    unlink(p);
    kv_gguf_close(NULL);
    /* NULL handles are harmless for the accessors */
    CHECK(kv_gguf_n_kv(NULL) == 0 && kv_gguf_n_tensors(NULL) == 0 && kv_gguf_find_key(NULL, "x") == -1);
    CHECK(kv_gguf_find_tensor(NULL, "x") == NULL);
    /* a minimal vocab-only style file: header and one key, no tensors, no padding */
    unsigned char mini[64];
    memcpy(mini, "GGUF", 4), put_u32(mini + 4, 3), put_u64(mini + 8, 0), put_u64(mini + 16, 1);
    put_u64(mini + 24, 1), mini[32] = 'k', put_u32(mini + 33, KV_GGUF_UINT8), mini[37] = 9;
    kv_gguf *g = kv_gguf_open_mem(mini, 38, &err);
    CHECKF(g != NULL, "%s", err.msg);
    uint64_t v = 0;
    CHECK(g && kv_gguf_get_u64(g, "k", &v, &err) == 0 && v == 9);
    CHECK(g && kv_gguf_data_offset(g) == 38);
    kv_gguf_close(g);
    /* no keys and no tensors */
    put_u64(mini + 16, 0);
    g = kv_gguf_open_mem(mini, 24, &err);
    CHECK(g && kv_gguf_n_kv(g) == 0 && kv_gguf_n_tensors(g) == 0);
    kv_gguf_close(g);
}

static void test_getter_types(void) {
    kv_gguf_writer *w = kv_gguf_writer_new();
    REQUIRE(w);
    int8_t neg = -5;
    double big = 1e300;
    kv_gguf_writer_add_scalar(w, "neg", KV_GGUF_INT8, &neg);
    kv_gguf_writer_add_u64(w, "huge", 1ull << 40);
    kv_gguf_writer_add_u64(w, "max", UINT64_MAX);
    kv_gguf_writer_add_scalar(w, "big", KV_GGUF_FLOAT64, &big);
    kv_gguf_writer_add_str(w, "s", "x");
    kv_gguf_writer_add_f32(w, "f", 2.5f);
    kv_gguf_writer_add_arr(w, "arr", KV_GGUF_UINT8, "\1\2", 2);
    kv_err err;
    const char *p = tmp_path("get");
    REQUIRE(kv_gguf_writer_write(w, p, &err) == 0);
    kv_gguf_writer_free(w);
    kv_gguf *g = kv_gguf_open(p, &err);
    unlink(p); /* the mapping stays valid */
    REQUIRE(g);
    uint64_t u = 77;
    uint32_t u32 = 77;
    int64_t i = 77;
    float f = 7;
    int b = 7;
    kv_gguf_str s = {0, NULL};
    CHECK(kv_gguf_get_u64(g, "absent", &u, &err) == 1 && u == 77);
    CHECK(kv_gguf_get_u32(g, "absent", &u32, &err) == 1 && u32 == 77);
    CHECK(kv_gguf_get_f32(g, "absent", &f, &err) == 1 && f == 7);
    CHECK(kv_gguf_get_str(g, "absent", &s, &err) == 1 && s.data == NULL);
    CHECK(kv_gguf_get_arr(g, "absent", NULL, NULL, &err) == 1);
    CHECK(kv_gguf_get_u64(g, "neg", &u, &err) == KV_ERR_FORMAT && strstr(err.msg, "'neg'") && u == 77);
    CHECK(kv_gguf_get_u32(g, "neg", &u32, &err) == KV_ERR_FORMAT && strstr(err.msg, "-5"));
    CHECK(kv_gguf_get_i64(g, "neg", &i, &err) == 0 && i == -5);
    CHECK(kv_gguf_get_u32(g, "huge", &u32, &err) == KV_ERR_FORMAT && strstr(err.msg, "uint32") && u32 == 77);
    CHECK(kv_gguf_get_i64(g, "huge", &i, &err) == 0 && i == (1ll << 40));
    CHECK(kv_gguf_get_i64(g, "max", &i, &err) == KV_ERR_FORMAT && strstr(err.msg, "int64"));
    CHECK(kv_gguf_get_f32(g, "big", &f, &err) == KV_ERR_FORMAT && strstr(err.msg, "float32"));
    CHECK(kv_gguf_get_f32(g, "s", &f, &err) == KV_ERR_FORMAT && strstr(err.msg, "string"));
    CHECK(kv_gguf_get_f32(g, "huge", &f, &err) == KV_ERR_FORMAT); /* integers are not floats */
    CHECK(kv_gguf_get_u64(g, "f", &u, &err) == KV_ERR_FORMAT && strstr(err.msg, "not an integer"));
    CHECK(kv_gguf_get_str(g, "f", &s, &err) == KV_ERR_FORMAT && strstr(err.msg, "not a string"));
    CHECK(kv_gguf_get_bool(g, "f", &b, &err) == KV_ERR_FORMAT && b == 7);
    CHECK(kv_gguf_get_arr(g, "f", NULL, NULL, &err) == KV_ERR_FORMAT && strstr(err.msg, "not an array"));
    CHECK(kv_gguf_get_u64(g, "arr", &u, &err) == KV_ERR_FORMAT);
    CHECK(kv_gguf_arr_i64(g, "arr", 1) == 2);
    kv_gguf_close(g);
}

/* ---- writer rejections, streaming, copy_kv ----------------------------- */

static void test_writer_rejects(void) {
    kv_gguf_writer *w = kv_gguf_writer_new();
    REQUIRE(w);
    float d[32] = {0};
    int64_t ne[] = {32, 1};
    CHECK(kv_gguf_writer_add_u32(w, "k", 1) == 0);
    CHECK(kv_gguf_writer_add_u32(w, "k", 2) == KV_ERR_INVAL);
    CHECK(kv_gguf_writer_add_u32(w, "", 2) == KV_ERR_INVAL);
    CHECK(kv_gguf_writer_add_str(w, "s", NULL) == KV_ERR_INVAL);
    CHECK(kv_gguf_writer_add_arr(w, "a", KV_GGUF_STRING, d, 1) == KV_ERR_INVAL);
    CHECK(kv_gguf_writer_add_arr(w, "a", KV_GGUF_BOOL, "\2", 1) == KV_ERR_INVAL);
    CHECK(kv_gguf_writer_add_arr(w, "a", KV_GGUF_UINT64, d, (uint64_t)1 << 62) == KV_ERR_INVAL);
    CHECK(kv_gguf_writer_add_scalar(w, "a", KV_GGUF_STRING, d) == KV_ERR_INVAL);
    CHECK(kv_gguf_writer_add_u64(w, "general.alignment", 32) == KV_ERR_INVAL); /* must be u32 */
    CHECK(kv_gguf_writer_add_u32(w, "general.alignment", 24) == KV_ERR_INVAL);
    CHECK(kv_gguf_writer_add_raw(w, "r", KV_GGUF_UINT32, "\1\0\0\0\0", 5) == KV_ERR_INVAL); /* trailing */
    CHECK(kv_gguf_writer_add_raw(w, "r", KV_GGUF_STRING, "\11\0\0\0\0\0\0\0ab", 10) == KV_ERR_INVAL);
    CHECK(kv_gguf_writer_add_tensor(w, "t", KV_TYPE_F32, 2, ne, d, 100) == KV_ERR_INVAL); /* size */
    CHECK(kv_gguf_writer_add_tensor(w, "t", (kv_type)4, 2, ne, d, 128) == KV_ERR_INVAL);   /* type */
    CHECK(kv_gguf_writer_add_tensor(w, "t", KV_TYPE_F32, 0, ne, d, 128) == KV_ERR_INVAL);  /* dims */
    CHECK(kv_gguf_writer_add_tensor(w, "t", KV_TYPE_F32, 5, ne, d, 128) == KV_ERR_INVAL);
    int64_t ne33[] = {33};
    CHECK(kv_gguf_writer_add_tensor(w, "t", KV_TYPE_Q8_0, 1, ne33, d, 34) == KV_ERR_INVAL);
    int64_t ne0[] = {0};
    CHECK(kv_gguf_writer_add_tensor(w, "t", KV_TYPE_F32, 1, ne0, d, 0) == KV_ERR_INVAL);
    char longname[80];
    memset(longname, 'x', 64), longname[64] = 0;
    CHECK(kv_gguf_writer_add_tensor(w, longname, KV_TYPE_F32, 2, ne, d, 128) == KV_ERR_INVAL);
    longname[63] = 0;
    CHECK(kv_gguf_writer_add_tensor(w, longname, KV_TYPE_F32, 2, ne, d, 128) == 0);
    CHECK(kv_gguf_writer_add_tensor(w, longname, KV_TYPE_F32, 2, ne, d, 128) == KV_ERR_INVAL); /* dup */
    /* the first failure sticks: write reports it and creates nothing */
    kv_err err;
    const char *p = tmp_path("rej");
    unlink(p);
    CHECK(kv_gguf_writer_write(w, p, &err) == KV_ERR_INVAL && strstr(err.msg, "duplicate key 'k'"));
    CHECK(access(p, F_OK) != 0);
    kv_gguf_writer_free(w);
    kv_gguf_writer_free(NULL);
    /* unwritable path */
    w = kv_gguf_writer_new();
    CHECK(kv_gguf_writer_write(w, "/nonexistent-dir-kvtop/x.gguf", &err) == KV_ERR_IO &&
          strstr(err.msg, "nonexistent-dir-kvtop"));
    kv_gguf_writer_free(w);
}

typedef struct fill_ctx {
    int calls;
    int64_t next_row; /* checks ascending order */
    int fail_at;      /* row at which to fail, -1 never */
} fill_ctx;

static int fill_rows(void *vctx, void *dst, int64_t row0, int64_t n_rows) {
    fill_ctx *c = vctx;
    c->calls++;
    if (row0 != c->next_row) return KV_ERR_INVAL;
    if (c->fail_at >= 0 && row0 + n_rows > c->fail_at) return KV_ERR_IO;
    float *f = dst;
    for (int64_t r = 0; r < n_rows; r++)
        for (int j = 0; j < 1000; j++) f[r * 1000 + j] = (float)((row0 + r) * 1000 + j);
    c->next_row = row0 + n_rows;
    return 0;
}

static void test_writer_fill(void) {
    /* 1000 x 600 floats = 2.4 MB: several fill calls */
    int64_t ne[] = {1000, 600};
    fill_ctx c = {0, 0, -1};
    kv_gguf_writer *w = kv_gguf_writer_new();
    REQUIRE(w);
    CHECK(kv_gguf_writer_add_tensor_fn(w, "big", KV_TYPE_F32, 2, ne, fill_rows, &c) == 0);
    CHECK(kv_gguf_writer_add_tensor_fn(w, "nofill", KV_TYPE_F32, 2, ne, NULL, &c) == KV_ERR_INVAL);
    kv_gguf_writer_free(w);
    w = kv_gguf_writer_new();
    CHECK(kv_gguf_writer_add_tensor_fn(w, "big", KV_TYPE_F32, 2, ne, fill_rows, &c) == 0);
    kv_err err;
    const char *p = tmp_path("fill");
    CHECKF(kv_gguf_writer_write(w, p, &err) == 0, "%s", err.msg);
    kv_gguf_writer_free(w);
    CHECK(c.calls >= 3 && c.next_row == 600);
    kv_gguf *g = kv_gguf_open(p, &err);
    REQUIRE(g);
    const kv_gguf_tensor *t = kv_gguf_find_tensor(g, "big");
    REQUIRE(t && t->size == 1000 * 600 * 4);
    int ok = 1;
    for (int64_t i = 0; i < 600000; i += 997) {
        float v;
        memcpy(&v, (const char *)t->data + i * 4, 4);
        ok &= v == (float)i;
    }
    CHECK(ok);
    kv_gguf_close(g);
    unlink(p);
    /* a failing producer aborts the write and leaves neither file */
    fill_ctx c2 = {0, 0, 300};
    w = kv_gguf_writer_new();
    CHECK(kv_gguf_writer_add_tensor_fn(w, "big", KV_TYPE_F32, 2, ne, fill_rows, &c2) == 0);
    CHECK(kv_gguf_writer_write(w, p, &err) == KV_ERR_IO && strstr(err.msg, "'big'"));
    kv_gguf_writer_free(w);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    CHECK(access(p, F_OK) != 0 && access(tmp, F_OK) != 0);
}

static int skip_non_tokenizer(const char *key, void *ctx) {
    (*(int *)ctx)++;
    return strncmp(key, "tokenizer.", 10) != 0;
}

static void test_copy_kv(void) {
    kv_err err;
    kv_gguf *src = kv_gguf_open(harness_shared_path("models/stories260K.gguf"), &err);
    REQUIRE(src);
    kv_gguf_writer *w = kv_gguf_writer_new();
    int seen = 0;
    CHECK(kv_gguf_writer_copy_kv(w, src, skip_non_tokenizer, &seen) == 0);
    CHECK(seen == kv_gguf_n_kv(src));
    const char *p = tmp_path("copy");
    CHECKF(kv_gguf_writer_write(w, p, &err) == 0, "%s", err.msg);
    kv_gguf_writer_free(w);
    kv_gguf *g = kv_gguf_open(p, &err);
    REQUIRE(g);
    int n_tok = 0;
    for (int64_t i = 0; i < kv_gguf_n_kv(src); i++)
        if (!strncmp(kv_gguf_key_at(src, i).data, "tokenizer.", 10)) n_tok++;
    CHECK(n_tok >= 5 && kv_gguf_n_kv(g) == n_tok);
    for (int64_t i = 0; i < kv_gguf_n_kv(g); i++) {
        kv_gguf_str k = kv_gguf_key_at(g, i);
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)k.len, k.data);
        int64_t j = kv_gguf_find_key(src, key);
        REQUIRE(j >= 0);
        char a[256], b[256];
        kv_gguf_format_value(g, i, a, sizeof a);
        kv_gguf_format_value(src, j, b, sizeof b);
        CHECKF(!strcmp(a, b) && kv_gguf_type_at(g, i) == kv_gguf_type_at(src, j), "%s", key);
    }
    for (uint64_t i = 0; i < 512; i += 37) {
        kv_gguf_str x = kv_gguf_arr_str(g, "tokenizer.ggml.tokens", i);
        kv_gguf_str y = kv_gguf_arr_str(src, "tokenizer.ggml.tokens", i);
        CHECK(x.len == y.len && !memcmp(x.data, y.data, x.len));
    }
    kv_gguf_close(g);
    kv_gguf_close(src);
    unlink(p);
}

/* A 50k-token string array: lookups are O(1) (the whole scan below would be
 * quadratic otherwise) and every element reads back. */
static void test_big_string_array(void) {
    enum { N = 50000 };
    static char store[N][16];
    static const char *strs[N];
    for (int i = 0; i < N; i++) {
        snprintf(store[i], sizeof store[i], "tok%d", i);
        strs[i] = store[i];
    }
    kv_gguf_writer *w = kv_gguf_writer_new();
    CHECK(kv_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", strs, NULL, N) == 0);
    kv_err err;
    const char *p = tmp_path("bigarr");
    REQUIRE(kv_gguf_writer_write(w, p, &err) == 0);
    kv_gguf_writer_free(w);
    kv_gguf *g = kv_gguf_open(p, &err);
    REQUIRE(g);
    double t0 = kv_now_s();
    int ok = 1;
    for (int rep = 0; rep < 20; rep++)
        for (int i = N - 1; i >= 0; i--) ok &= kv_gguf_str_eq(kv_gguf_arr_str(g, "tokenizer.ggml.tokens", (uint64_t)i), store[i]);
    double dt = kv_now_s() - t0;
    CHECK(ok);
    CHECKF(dt < 2.0, "1M lookups took %.2f s", dt);
    kv_gguf_close(g);
    unlink(p);
}

TEST_MAIN(T(test_roundtrip_all_types), T(test_alignment), T(test_stories260k), T(test_truncation_every_prefix),
          T(test_corruptions), T(test_open_errors), T(test_getter_types), T(test_writer_rejects),
          T(test_writer_fill), T(test_copy_kv), T(test_big_string_array))
