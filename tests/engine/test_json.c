/* test_json.c - the strict JSON reader (values, escapes, what it rejects and
 * where it says the error is) and the streaming writer (escaping, exact
 * numbers, misuse detection, write -> parse round trips). */
#include <stdint.h>

#include "../../engine/json.h"
#include "../harness.h"

static kv_json *parse(const char *s, kv_err *err) { return kv_json_parse(s, strlen(s), err); }

static void test_parse_values(void) {
    kv_err err;
    const char *doc = " {\"a\": [1, -2.5, 3e2, 0, -0.0, 1E-3], \"b\": {\"c\": true, \"d\": false, \"e\": null},"
                      " \"s\": \"x\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\\u0000z\", \"\": []}\n";
    kv_json *v = parse(doc, &err);
    REQUIRE(v || (printf("%s\n", err.msg), 0));
    CHECK(kv_json_type_of(v) == KV_JSON_OBJECT && kv_json_len(v) == 4);
    const kv_json *a = kv_json_get(v, "a");
    CHECK(kv_json_type_of(a) == KV_JSON_ARRAY && kv_json_len(a) == 6);
    CHECK(kv_json_number(kv_json_at(a, 0)) == 1 && kv_json_number(kv_json_at(a, 1)) == -2.5);
    CHECK(kv_json_number(kv_json_at(a, 2)) == 300 && kv_json_number(kv_json_at(a, 5)) == 1e-3);
    const kv_json *b = kv_json_get(v, "b");
    CHECK(kv_json_bool(kv_json_get(b, "c")) == 1 && kv_json_type_of(kv_json_get(b, "d")) == KV_JSON_BOOL);
    CHECK(kv_json_type_of(kv_json_get(b, "e")) == KV_JSON_NULL && kv_json_get(b, "e") != NULL);
    CHECK(kv_json_get(b, "zz") == NULL);
    size_t len;
    const char *s = kv_json_str(kv_json_get(v, "s"), &len);
    static const char want[] = "x\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80\0z";
    CHECK(s && len == sizeof want - 1 && !memcmp(s, want, len));
    CHECK(kv_json_len(kv_json_get(v, "")) == 0 && kv_json_type_of(kv_json_get(v, "")) == KV_JSON_ARRAY);
    size_t kl;
    CHECK(!strcmp(kv_json_key_at(v, 1, &kl), "b") && kl == 1);
    /* Accessors on the wrong type or NULL are neutral. */
    CHECK(kv_json_number(b) == 0 && kv_json_str(a, NULL) == NULL && kv_json_at(a, 6) == NULL);
    CHECK(kv_json_len(NULL) == 0 && kv_json_type_of(NULL) == KV_JSON_NULL && kv_json_key_at(a, 0, NULL) == NULL);
    kv_json_free(v);
    kv_json_free(NULL);

    /* Scalars at the top; raw UTF-8 passes through. */
    v = parse("\"h\xc3\xa9llo \xe2\x82\xac\"", &err);
    CHECK(v && !strcmp(kv_json_str(v, NULL), "h\xc3\xa9llo \xe2\x82\xac"));
    kv_json_free(v);
    v = parse("-12345678901234567", &err);
    CHECK(v && kv_json_number(v) == -12345678901234567.0);
    kv_json_free(v);
    /* Not NUL-terminated input: only len bytes are read. */
    char buf[4] = {'[', '7', ']', 'x'};
    v = kv_json_parse(buf, 3, &err);
    CHECK(v && kv_json_number(kv_json_at(v, 0)) == 7);
    kv_json_free(v);
}

static void test_parse_errors(void) {
    static const struct {
        const char *text, *where, *what;
    } bad[] = {
        {"", "line 1, column 1", "unexpected end"},
        {"[1, 2,]", "line 1, column 7", "trailing comma"},
        {"{\"a\": 1,}", "line 1, column 9", "trailing comma"},
        {"[01]", "line 1, column 2", "leading zero"},
        {"[1.]", "line 1, column 4", "digit expected"},
        {"[.5]", "line 1, column 2", "unexpected character"},
        {"[+1]", "line 1, column 2", "unexpected character"},
        {"[1e]", "line 1, column 4", "exponent"},
        {"[NaN]", "line 1, column 2", "unexpected character"},
        {"[1e999]", "line 1, column 2", "number out of range"},
        {"// c\n1", "line 1, column 1", "unexpected character"},
        {"{'a': 1}", "line 1, column 2", "expected a string key"},
        {"{\"a\" 1}", "line 1, column 6", "expected ':'"},
        {"{\"a\": 1 \"b\": 2}", "line 1, column 9", "expected ',' or '}'"},
        {"[1 2]", "line 1, column 4", "expected ',' or ']'"},
        {"[tru]", "line 1, column 2", "invalid literal"},
        {"\"abc", "line 1, column 1", "unterminated string"},
        {"\"a\nb\"", "line 1, column 3", "control character"},
        {"\"\\x41\"", "line 1, column 2", "invalid escape"},
        {"\"\\u12G4\"", "line 1, column 2", "invalid \\u escape"},
        {"\"\\ud83d\"", "line 1, column 2", "high surrogate"},
        {"\"\\ud83d\\u0041\"", "line 1, column 2", "high surrogate"},
        {"\"\\ude00\"", "line 1, column 2", "lone low surrogate"},
        {"\"\xff\"", "line 1, column 2", "invalid UTF-8"},
        {"\"\xc0\x80\"", "line 1, column 2", "invalid UTF-8"},       /* overlong NUL */
        {"\"\xed\xa0\x80\"", "line 1, column 2", "invalid UTF-8"},   /* encoded surrogate */
        {"1 2", "line 1, column 3", "trailing characters"},
        {"{\"a\": 1, \"a\": 2}", "line 1, column 1", "duplicate key 'a'"},
        {"\n\n  [1,\n   x]", "line 4, column 4", "unexpected character"},
        {"\xef\xbb\xbf{}", "line 1, column 1", "unexpected character"},
    };
    for (size_t i = 0; i < KV_ARRAY_LEN(bad); i++) {
        kv_err err;
        kv_json *v = parse(bad[i].text, &err);
        CHECKF(v == NULL, "case %zu parsed", i);
        kv_json_free(v);
        CHECKF(err.code == KV_ERR_FORMAT, "case %zu: code %d", i, err.code);
        CHECKF(strstr(err.msg, bad[i].where) && strstr(err.msg, bad[i].what), "case %zu: '%s' (want '%s', '%s')", i,
               err.msg, bad[i].where, bad[i].what);
    }
    /* Depth: 64 levels parse, 65 do not. */
    char deep[200];
    memset(deep, '[', 64);
    memset(deep + 64, ']', 64);
    kv_err err;
    kv_json *v = kv_json_parse(deep, 128, &err);
    CHECK(v != NULL);
    kv_json_free(v);
    memset(deep, '[', 65);
    memset(deep + 65, ']', 65);
    v = kv_json_parse(deep, 130, &err);
    CHECK(v == NULL && strstr(err.msg, "nesting"));
    /* Names and first lines, as a JSONL reader uses them. */
    v = kv_json_parse_named("{\"a\" 1}", 7, "p.jsonl", 12, &err);
    CHECK(v == NULL && strstr(err.msg, "p.jsonl:12:6: expected ':'"));
    /* Many keys: duplicate detection stays correct past the pairwise size. */
    char big[4096];
    size_t n = 0;
    n += (size_t)snprintf(big + n, sizeof big - n, "{");
    for (int i = 0; i < 100; i++) n += (size_t)snprintf(big + n, sizeof big - n, "%s\"k%d\": %d", i ? "," : "", i, i);
    n += (size_t)snprintf(big + n, sizeof big - n, "}");
    v = kv_json_parse(big, n, &err);
    CHECK(v && kv_json_len(v) == 100 && kv_json_number(kv_json_get(v, "k77")) == 77);
    kv_json_free(v);
    big[n - 1] = ',';
    n += (size_t)snprintf(big + n, sizeof big - n, "\"k42\": 0}");
    v = kv_json_parse(big, n, &err);
    CHECK(v == NULL && strstr(err.msg, "duplicate key 'k42'"));
}

static char *write_doc(void (*fn)(kv_json_writer *), int pretty, int *rc) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    kv_json_writer w;
    kv_json_writer_init(&w, f, pretty);
    fn(&w);
    *rc = kv_json_writer_finish(&w);
    fclose(f);
    return text;
}

static void doc_a(kv_json_writer *w) {
    kv_json_write_begin_object(w);
    kv_json_write_key(w, "name");
    kv_json_write_string(w, "q\"uo\\te\n\t\x01 \xc3\xa9 \xff end");
    kv_json_write_key(w, "nums");
    kv_json_write_begin_array(w);
    kv_json_write_number(w, 0.1);
    kv_json_write_number(w, 1.0 / 3.0);
    kv_json_write_number(w, -1e300);
    kv_json_write_number(w, 42);
    kv_json_write_number(w, NAN);
    kv_json_write_number(w, INFINITY);
    kv_json_write_int(w, INT64_MIN);
    kv_json_write_uint(w, UINT64_MAX);
    kv_json_write_end_array(w);
    kv_json_write_key(w, "flags");
    kv_json_write_begin_object(w);
    kv_json_write_key(w, "t");
    kv_json_write_bool(w, 1);
    kv_json_write_key(w, "n");
    kv_json_write_null(w);
    kv_json_write_key(w, "empty");
    kv_json_write_begin_array(w);
    kv_json_write_end_array(w);
    kv_json_write_end_object(w);
    kv_json_write_key(w, "nul");
    kv_json_write_string_n(w, "a\0b", 3);
    kv_json_write_end_object(w);
}

static void test_writer(void) {
    for (int pretty = 0; pretty <= 1; pretty++) {
        int rc;
        char *text = write_doc(doc_a, pretty, &rc);
        CHECK(rc == 0);
        kv_err err;
        kv_json *v = parse(text, &err);
        CHECKF(v != NULL, "%s\n%s", err.msg, text);
        if (!v) {
            free(text);
            continue;
        }
        CHECK(!strcmp(kv_json_str(kv_json_get(v, "name"), NULL), "q\"uo\\te\n\t\x01 \xc3\xa9 \xef\xbf\xbd end"));
        const kv_json *nums = kv_json_get(v, "nums");
        CHECK(kv_json_number(kv_json_at(nums, 0)) == 0.1 && kv_json_number(kv_json_at(nums, 1)) == 1.0 / 3.0);
        CHECK(kv_json_number(kv_json_at(nums, 2)) == -1e300 && kv_json_number(kv_json_at(nums, 3)) == 42);
        CHECK(kv_json_type_of(kv_json_at(nums, 4)) == KV_JSON_NULL && kv_json_type_of(kv_json_at(nums, 5)) == KV_JSON_NULL);
        CHECK(kv_json_number(kv_json_at(nums, 6)) == (double)INT64_MIN);
        CHECK(kv_json_bool(kv_json_get(kv_json_get(v, "flags"), "t")) == 1);
        size_t l;
        const char *nul = kv_json_str(kv_json_get(v, "nul"), &l);
        CHECK(l == 3 && !memcmp(nul, "a\0b", 3));
        if (!pretty) {
            CHECK(strstr(text, "\"nums\":[0.1,0.3333333333333333,-1e+300,42,null,null,-9223372036854775808,"
                               "18446744073709551615]") != NULL);
            CHECK(strstr(text, "\\u0001") && !strchr(text, '\n'));
        } else {
            CHECK(strstr(text, "{\n  \"name\": ") == text && strstr(text, "\n    \"t\": true"));
        }
        /* Writing the parsed tree gives the same text back (the compact form
         * is canonical once NaN and bad UTF-8 are gone). */
        char *again = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&again, &len);
        kv_json_writer w;
        kv_json_writer_init(&w, f, pretty);
        kv_json_write_value(&w, v);
        CHECK(kv_json_writer_finish(&w) == 0);
        fclose(f);
        kv_json *v2 = parse(again, &err);
        CHECK(v2 != NULL);
        char *third = NULL;
        FILE *g = open_memstream(&third, &len);
        kv_json_writer_init(&w, g, pretty);
        kv_json_write_value(&w, v2);
        fclose(g);
        CHECK(!strcmp(again, third));
        free(third);
        kv_json_free(v2);
        free(again);
        kv_json_free(v);
        free(text);
    }
}

static void misuse_key_in_array(kv_json_writer *w) {
    kv_json_write_begin_array(w);
    kv_json_write_key(w, "x");
    kv_json_write_end_array(w);
}
static void misuse_value_without_key(kv_json_writer *w) {
    kv_json_write_begin_object(w);
    kv_json_write_int(w, 1);
    kv_json_write_end_object(w);
}
static void misuse_unbalanced(kv_json_writer *w) {
    kv_json_write_begin_object(w);
    kv_json_write_end_array(w);
}
static void misuse_unfinished(kv_json_writer *w) { kv_json_write_begin_array(w); }
static void misuse_dangling_key(kv_json_writer *w) {
    kv_json_write_begin_object(w);
    kv_json_write_key(w, "k");
    kv_json_write_end_object(w);
}
static void misuse_two_values(kv_json_writer *w) {
    kv_json_write_int(w, 1);
    kv_json_write_int(w, 2);
}
static void misuse_too_deep(kv_json_writer *w) {
    for (int i = 0; i < KV_JSON_MAX_DEPTH + 1; i++) kv_json_write_begin_array(w);
    for (int i = 0; i < KV_JSON_MAX_DEPTH + 1; i++) kv_json_write_end_array(w);
}
static void nothing(kv_json_writer *w) { (void)w; }

static void test_writer_misuse(void) {
    void (*cases[])(kv_json_writer *) = {misuse_key_in_array, misuse_value_without_key, misuse_unbalanced,
                                         misuse_unfinished, misuse_dangling_key, misuse_two_values,
                                         misuse_too_deep, nothing};
    for (size_t i = 0; i < KV_ARRAY_LEN(cases); i++) {
        int rc;
        char *t = write_doc(cases[i], 0, &rc);
        CHECKF(rc == KV_ERR_INVAL, "case %zu: rc %d", i, rc);
        free(t);
    }
    kv_json_writer w;
    kv_json_writer_init(&w, NULL, 0);
    kv_json_write_int(&w, 1);
    CHECK(kv_json_writer_finish(&w) == KV_ERR_INVAL);
    /* A stream that fails to write is an I/O error. */
    FILE *f = fopen("/dev/full", "w");
    if (f) {
        setvbuf(f, NULL, _IONBF, 0);
        kv_json_writer_init(&w, f, 0);
        kv_json_write_string(&w, "x");
        CHECK(kv_json_writer_finish(&w) == KV_ERR_IO);
        fclose(f);
    }
}

TEST_MAIN(T(test_parse_values), T(test_parse_errors), T(test_writer), T(test_writer_misuse))
