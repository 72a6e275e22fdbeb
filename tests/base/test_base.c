/* test_base.c - the ground floor's helpers, linked with libkvbase alone:
 * the growable array, the UTF-8 codec, reading a whole file, the byte
 * formatter and the string copy. */
#include <limits.h>
#include <unistd.h>

#include "../harness.h"
#include "../../base/common.h"
#include "../../base/file.h"
#include "../../base/fmt.h"
#include "../../base/utf8.h"
#include "../../base/vec.h"

static void test_grow(void) {
    int *v = NULL, cap = 0;
    CHECK(kv_grow((void **)&v, &cap, 0, sizeof *v) == 0 && v == NULL && cap == 0); /* nothing needed */
    REQUIRE(kv_grow((void **)&v, &cap, 1, sizeof *v) == 0 && v && cap == 16);
    for (int i = 0; i < 16; i++) v[i] = i;
    REQUIRE(kv_grow((void **)&v, &cap, 17, sizeof *v) == 0 && cap == 32);
    int kept = 1;
    for (int i = 0; i < 16; i++) kept &= v[i] == i;
    CHECK(kept);
    int *before = v;
    CHECK(kv_grow((void **)&v, &cap, 20, sizeof *v) == 0 && v == before && cap == 32); /* fits: no-op */
    /* A size that overflows fails and leaves the array as it was. */
    CHECK(kv_grow((void **)&v, &cap, INT_MAX, SIZE_MAX / 4) == KV_ERR_NOMEM && v == before && cap == 32);
    free(v);

    char *b = NULL;
    size_t bc = 0;
    REQUIRE(kv_grow_size((void **)&b, &bc, 100, 1) == 0 && b && bc == 128);
    char *bb = b;
    CHECK(kv_grow_size((void **)&b, &bc, SIZE_MAX, 2) == KV_ERR_NOMEM && b == bb && bc == 128);
    free(b);
}

static void test_utf8_encode(void) {
    char o[4];
    CHECK(kv_utf8_encode(0x41, o) == 1 && o[0] == 'A');
    CHECK(kv_utf8_encode(0xE9, o) == 2 && !memcmp(o, "\xc3\xa9", 2));
    CHECK(kv_utf8_encode(0x4E2D, o) == 3 && !memcmp(o, "\xe4\xb8\xad", 3));
    CHECK(kv_utf8_encode(0x10FFFF, o) == 4 && !memcmp(o, "\xf4\x8f\xbf\xbf", 4));
    /* surrogates and values past U+10FFFF have no UTF-8 */
    CHECK(kv_utf8_encode(0xD800, o) == 0);
    CHECK(kv_utf8_encode(0xDBFF, o) == 0);
    CHECK(kv_utf8_encode(0xDFFF, o) == 0);
    CHECK(kv_utf8_encode(0x110000, o) == 0);
    CHECK(kv_utf8_encode(0xFFFFFFFFu, o) == 0);
    CHECK(kv_utf8_encode(0xD7FF, o) == 3 && kv_utf8_encode(0xE000, o) == 3);
    /* every encodable code point decodes back to itself */
    int ok = 1;
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp += (cp < 0x3000 ? 1 : 97)) {
        size_t n = kv_utf8_encode(cp, o);
        if (cp >= 0xD800 && cp <= 0xDFFF) {
            ok &= n == 0;
            continue;
        }
        uint32_t back;
        ok &= n >= 1 && kv_utf8_decode((const unsigned char *)o, n, &back) == n && back == cp;
    }
    CHECK(ok);
}

static void test_utf8_decode(void) {
    uint32_t cp;
    const unsigned char *u;
    u = (const unsigned char *)"\xed\xa0\x80"; /* U+D800 spelled in UTF-8 */
    CHECK(kv_utf8_decode(u, 3, &cp) == 1 && cp == KV_UTF8_INVALID);
    u = (const unsigned char *)"\xf4\x90\x80\x80"; /* U+110000 */
    CHECK(kv_utf8_decode(u, 4, &cp) == 1 && cp == KV_UTF8_INVALID);
    u = (const unsigned char *)"\xc0\xaf"; /* overlong '/' */
    CHECK(kv_utf8_decode(u, 2, &cp) == 1 && cp == KV_UTF8_INVALID);
    u = (const unsigned char *)"\xe0\x80\xaf";
    CHECK(kv_utf8_decode(u, 3, &cp) == 1 && cp == KV_UTF8_INVALID);
    u = (const unsigned char *)"\xe4\xb8"; /* truncated */
    CHECK(kv_utf8_decode(u, 2, &cp) == 1 && cp == KV_UTF8_INVALID);
    u = (const unsigned char *)"\x80";
    CHECK(kv_utf8_decode(u, 1, &cp) == 1 && cp == KV_UTF8_INVALID);
    CHECK(kv_utf8_valid_len((const unsigned char *)"\xe4\xb8\xad!", 4) == 3);
    CHECK(kv_utf8_valid_len((const unsigned char *)"\xed\xa0\x80", 3) == 0);
    CHECK(kv_utf8_valid("h\xc3\xa9llo", 6) && !kv_utf8_valid("h\xc3", 2));
    CHECK(kv_utf8_seq_len(0xC1) == 0 && kv_utf8_seq_len(0xC2) == 2 && kv_utf8_seq_len(0xF4) == 4 &&
          kv_utf8_seq_len(0xF5) == 0 && kv_utf8_seq_len(0x80) == 0);
    /* cuts: never between a lead byte and its continuation */
    const char *s = "a\xe4\xb8\xad" "b"; /* a, U+4E2D, b */
    CHECK(kv_utf8_boundary(s, 5, 1) == 1);
    CHECK(kv_utf8_boundary(s, 5, 2) == 1);
    CHECK(kv_utf8_boundary(s, 5, 3) == 1);
    CHECK(kv_utf8_boundary(s, 5, 4) == 4);
    CHECK(kv_utf8_boundary(s, 5, 5) == 5);
    CHECK(kv_utf8_boundary(s + 1, 3, 2) == 0);
}

static void write_file(const char *path, const char *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(bytes, 1, n, f);
    fclose(f);
}

static void test_read_file(void) {
    char path[512];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/kvtop-test-base-%d.txt", tmp && *tmp ? tmp : "/tmp", (int)getpid());
    write_file(path, "hello\0world", 11);
    char *buf = (char *)1;
    size_t len = 99;
    kv_err err;
    REQUIRE(kv_read_file(path, 0, &buf, &len, &err) == 0);
    CHECK(len == 11 && !memcmp(buf, "hello\0world", 11) && buf[11] == 0);
    free(buf);
    /* the cap: a file of exactly max_bytes loads, one byte more does not */
    REQUIRE(kv_read_file(path, 11, &buf, NULL, &err) == 0);
    free(buf);
    CHECK(kv_read_file(path, 10, &buf, &len, &err) == KV_ERR_FORMAT && buf == NULL);
    CHECKF(strstr(err.msg, path) && strstr(err.msg, "larger than 10 bytes"), "%s", err.msg);
    /* a file larger than the first buffer */
    size_t big = 100000;
    char *data = malloc(big);
    REQUIRE(data);
    for (size_t i = 0; i < big; i++) data[i] = (char)('a' + i % 26);
    write_file(path, data, big);
    REQUIRE(kv_read_file(path, big, &buf, &len, &err) == 0);
    CHECK(len == big && !memcmp(buf, data, big) && buf[big] == 0);
    free(buf);
    free(data);
    write_file(path, "", 0);
    REQUIRE(kv_read_file(path, 5, &buf, &len, &err) == 0);
    CHECK(len == 0 && buf && buf[0] == 0);
    free(buf);
    unlink(path);
    CHECK(kv_read_file(path, 0, &buf, &len, &err) == KV_ERR_IO && buf == NULL);
    CHECKF(strstr(err.msg, path) && strstr(err.msg, "cannot open"), "%s", err.msg);
    CHECK(kv_read_file(path, 0, &buf, NULL, NULL) == KV_ERR_IO); /* no error struct */
}

/* The TUI's strings are asserted in tests/tui/test_format.c; here the unit
 * and precision boundaries the CLI now shares. */
static void test_format_bytes(void) {
    static const struct {
        uint64_t n;
        const char *want;
    } cases[] = {
        {1024, "1.00 KiB"},          {10239, "10.00 KiB"}, /* 9.999 rounds up in its precision */
        {10240, "10.0 KiB"},         {102400, "100 KiB"},
        {1048575, "1024 KiB"},       {1048576, "1.00 MiB"},
        {5ull << 40, "5.00 TiB"},    {3ull << 50, "3.00 PiB"},
    };
    char b[32];
    for (size_t i = 0; i < KV_ARRAY_LEN(cases); i++) {
        int n = kv_format_bytes(b, sizeof b, cases[i].n);
        CHECKF(!strcmp(b, cases[i].want) && n == (int)strlen(b), "%llu: %s", (unsigned long long)cases[i].n, b);
    }
    CHECK(kv_format_bytes(NULL, 8, 1) == 0);
    b[0] = 'x';
    CHECK(kv_format_bytes(b, 0, 1) == 0 && b[0] == 'x');
}

static void test_copy_str(void) {
    char d[4];
    kv_copy_str(d, sizeof d, "abcdef");
    CHECK(!strcmp(d, "abc"));
    kv_copy_str(d, sizeof d, "ab");
    CHECK(!strcmp(d, "ab"));
    kv_copy_str(d, sizeof d, NULL);
    CHECK(d[0] == 0);
    d[0] = 'x';
    kv_copy_str(d, 0, "zz");
    CHECK(d[0] == 'x');
}

TEST_MAIN(T(test_grow), T(test_utf8_encode), T(test_utf8_decode), T(test_read_file), T(test_format_bytes),
          T(test_copy_str))
