/* test_format.c - the TUI's number, bar, sparkline, width and wrapping
 * formatters, checked against hand-computed strings. */
#include <math.h>
#include <string.h>

#include "../harness.h"
#include "../../tui/format.h"

static void test_bytes(void) {
    static const struct {
        uint64_t n;
        const char *want;
    } cases[] = {
        {0, "0 B"},
        {1023, "1023 B"},
        {1536, "1.50 KiB"},
        {12ull * 1024 * 1024, "12.0 MiB"},
        {300ull * 1024 * 1024 * 1024, "300 GiB"},
        {UINT64_MAX, "16.0 EiB"},
    };
    char b[32];
    for (size_t i = 0; i < KV_ARRAY_LEN(cases); i++) {
        kv_format_bytes(b, sizeof b, cases[i].n);
        CHECKF(!strcmp(b, cases[i].want), "%llu bytes: %s", (unsigned long long)cases[i].n, b);
    }
    /* Truncation never overflows and still terminates. */
    char t[4];
    int n = kv_format_bytes(t, sizeof t, 1536);
    CHECK(n == 3 && t[3] == 0 && !strcmp(t, "1.5"));
}

static void test_durations(void) {
    static const struct {
        double ms;
        int valid;
        const char *want;
    } cases[] = {
        {0.85, 1, "850us"},
        {3.456, 1, "3.46ms"},
        {12.34, 1, "12.3ms"},
        {1250, 1, "1.25s"},
        {125000, 1, "2m05s"},
        {7200000, 1, "2h00m"},
        {5, 0, "N/A"},
        {NAN, 1, "N/A"},
        {-1, 1, "N/A"},
    };
    char b[32];
    for (size_t i = 0; i < KV_ARRAY_LEN(cases); i++) {
        kv_format_ms(b, sizeof b, cases[i].ms, cases[i].valid);
        CHECKF(!strcmp(b, cases[i].want), "%g ms (valid %d): %s", cases[i].ms, cases[i].valid, b);
    }
}

static void test_counts_rates(void) {
    char b[32];
    kv_format_count(b, sizeof b, 999);
    CHECK(!strcmp(b, "999"));
    kv_format_count(b, sizeof b, 1234);
    CHECKF(!strcmp(b, "1.2k"), "%s", b);
    kv_format_count(b, sizeof b, 1999);
    CHECKF(!strcmp(b, "1.9k"), "%s", b); /* floors: never claims more than there is */
    kv_format_count(b, sizeof b, 45678);
    CHECKF(!strcmp(b, "45k"), "%s", b);
    kv_format_count(b, sizeof b, 3400000);
    CHECKF(!strcmp(b, "3.4M"), "%s", b);
    kv_format_rate(b, sizeof b, 12.345, "tok/s");
    CHECKF(!strcmp(b, "12.3 tok/s"), "%s", b);
    kv_format_rate(b, sizeof b, 2.5, "req/s");
    CHECKF(!strcmp(b, "2.50 req/s"), "%s", b);
    kv_format_rate(b, sizeof b, 15300, "tok/s");
    CHECKF(!strcmp(b, "15k tok/s"), "%s", b);
    kv_format_rate(b, sizeof b, -1, "tok/s");
    CHECK(!strcmp(b, "N/A"));
    kv_format_pct(b, sizeof b, 0.1234, 1);
    CHECKF(!strcmp(b, "12.3%"), "%s", b);
    kv_format_pct(b, sizeof b, 1.0, 1);
    CHECKF(!strcmp(b, "100%"), "%s", b);
    kv_format_pct(b, sizeof b, 0.5, 0);
    CHECK(!strcmp(b, "N/A"));
}

static void test_bars(void) {
    char b[128];
    int n = kv_format_bar(b, sizeof b, 10, 0.5, 0);
    CHECKF(n == 10 && !strcmp(b, "#####....."), "%s", b);
    kv_format_bar(b, sizeof b, 4, 2.0, 0); /* clamped */
    CHECK(!strcmp(b, "####"));
    kv_format_bar(b, sizeof b, 4, -1, 0);
    CHECK(!strcmp(b, "...."));
    kv_format_bar(b, sizeof b, 4, NAN, 0);
    CHECK(!strcmp(b, "...."));
    /* UTF-8: 0.5625 of 4 cells = 18 eighths = 2 full + a quarter block. */
    kv_format_bar(b, sizeof b, 4, 0.5625, 1);
    CHECKF(!strcmp(b, "\u2588\u2588\u258E "), "%s", b);
    CHECK(kv_format_width(b, -1) == 4);
    /* Too small a buffer: stops at a whole cell. */
    char t[5];
    kv_format_bar(t, sizeof t, 4, 1.0, 1);
    CHECK(!strcmp(t, "\u2588"));
    CHECK(kv_format_bar(b, sizeof b, 0, 0.5, 0) == 0 && b[0] == 0);
}

static void test_stacked(void) {
    char b[64];
    double parts[3] = {0.5, 0.25, 0};
    kv_format_stacked_bar(b, sizeof b, 8, parts, "PD+", 3, ' ');
    CHECKF(!strcmp(b, "PPPPDD  "), "[%s]", b);
    /* A tiny part still shows one cell. */
    double tiny[2] = {0.99, 0.01};
    kv_format_stacked_bar(b, sizeof b, 10, tiny, "PD", 2, '.');
    CHECKF(!strcmp(b, "PPPPPPPPPD"), "[%s]", b);
    /* Over-full parts are normalised, total width exact. */
    double over[2] = {1.0, 1.0};
    int n = kv_format_stacked_bar(b, sizeof b, 7, over, "ab", 2, '.');
    CHECK(n == 7);
    int a = 0, c = 0;
    for (int i = 0; i < 7; i++) a += b[i] == 'a', c += b[i] == 'b';
    CHECK(a + c == 7 && (a == 3 || a == 4));
}

static void test_sparkline(void) {
    char b[128];
    double v[5] = {0, 1, 2, 3, 4};
    int n = kv_format_sparkline(b, sizeof b, v, 5, 10, 0, 4, 0);
    CHECKF(n == 5 && !strcmp(b, ".-+#@"), "[%s]", b);
    /* Only the newest `width` values are drawn. */
    kv_format_sparkline(b, sizeof b, v, 5, 2, 0, 4, 0);
    CHECKF(!strcmp(b, "#@"), "[%s]", b);
    /* Auto scale with a 0 floor, UTF-8 glyphs. */
    double w[3] = {5, 10, NAN};
    kv_format_sparkline(b, sizeof b, w, 3, 10, 0, 0, 1);
    CHECKF(!strcmp(b, "\u2585\u2588 "), "[%s]", b);
    CHECK(kv_format_width(b, -1) == 3);
    CHECK(kv_format_sparkline(b, sizeof b, NULL, 3, 10, 0, 0, 1) == 0);
}

static void test_width_fit(void) {
    CHECK(kv_format_width("abc", -1) == 3);
    CHECK(kv_format_width("h\u00e9llo", -1) == 5);        /* é: 2 bytes, 1 column */
    CHECK(kv_format_width("\u4e2d\u6587", -1) == 4);      /* CJK: 2 columns each */
    CHECK(kv_format_width("e\u0301", -1) == 1);           /* combining accent */
    CHECK(kv_format_width("\xff\xfe", -1) == 2);          /* invalid bytes: 1 each */
    CHECK(kv_format_width("\xe4\xb8", -1) == 2);          /* truncated sequence */
    int used;
    int n = kv_format_prefix_fit("\u4e2d\u6587x", -1, 3, &used);
    CHECK(n == 3 && used == 2); /* never splits the wide char */
    char b[32];
    kv_format_fit(b, sizeof b, "hello world", 8);
    CHECKF(!strcmp(b, "hello w~"), "%s", b);
    kv_format_fit(b, sizeof b, "short", 8);
    CHECK(!strcmp(b, "short"));
    kv_format_fit(b, sizeof b, "\u4e2d\u6587\u4e2d", 4);
    CHECKF(!strcmp(b, "\u4e2d~"), "%s", b);
    char t[4];
    kv_format_fit(t, sizeof t, "hello", 10);
    CHECK(strlen(t) <= 3);
    /* A buffer smaller than the text's bytes: whole characters and the '~'
     * still within the columns (a byte cut once left a partial sequence
     * that ran into the '~', one column too wide; found by fuzz_tui_text). */
    char u[16];
    kv_format_fit(u, sizeof u, "ab\u0350\u0350\u0350\u0350\u0350\u0350\u0350cd", 4);
    CHECKF(kv_format_width(u, -1) <= 4 && u[strlen(u) - 1] == '~', "%s", u);
    uint64_t r = 0x243F6A8885A308D3ull;
    for (int k = 0; k < 20000; k++) {
        char src[64], out[40];
        int n = 1 + (int)(r % 60);
        for (int i = 0; i < n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            static const unsigned char pool[] = {'a', ' ', 0xcd, 0x90, 0xe4, 0xb8, 0xad, 0xb8, 0xf4, 0x91, 0x7e};
            src[i] = (char)pool[(r >> 33) % sizeof pool];
        }
        src[n] = 0;
        int cap = 2 + (int)((r >> 20) % 38), cols = 1 + (int)((r >> 40) % 30);
        kv_format_fit(out, (size_t)cap, src, cols);
        int w = kv_format_width(out, -1);
        if (w > cols || (int)strlen(out) >= cap) {
            CHECKF(0, "fit(cap %d, cols %d) width %d, %zu bytes", cap, cols, w, strlen(out));
            break;
        }
    }
}

static void test_wrap(void) {
    kv_wrap_line l[16];
    const char *s = "the quick brown fox";
    int n = kv_format_wrap(s, -1, 10, l, 16);
    CHECK(n == 2);
    CHECKF(l[0].len == 10 && !strncmp(s + l[0].off, "the quick ", 10), "%.*s", l[0].len, s + l[0].off);
    CHECK(!strncmp(s + l[1].off, "brown fox", 9) && l[1].len == 9);
    /* A long word is cut inside. */
    n = kv_format_wrap("abcdefghij", -1, 4, l, 16);
    CHECK(n == 3 && l[0].len == 4 && l[2].len == 2);
    /* Newlines force breaks; an empty line is kept. */
    const char *m = "a\n\nb";
    n = kv_format_wrap(m, -1, 10, l, 16);
    CHECK(n == 3 && l[0].len == 1 && l[1].len == 0 && m[l[2].off] == 'b');
    CHECK(kv_format_wrap("", -1, 10, l, 16) == 1 && l[0].len == 0);
    /* Counting only, and more lines than room. */
    CHECK(kv_format_wrap("aaaa bbbb cccc dddd", -1, 4, NULL, 0) == 4);
    CHECK(kv_format_wrap("aaaa bbbb cccc dddd", -1, 4, l, 2) == 4);
    /* Wide characters never split across a line end. */
    const char *cjk = "\u4e2d\u6587\u4e2d";
    n = kv_format_wrap(cjk, -1, 3, l, 16);
    CHECK(n == 3);
    for (int i = 0; i < n; i++) CHECK(kv_format_width(&cjk[l[i].off], l[i].len) <= 3);
    /* Every line fits for many widths on a mixed text. */
    const char *t = "Once upon a time, there was a little girl named Lily. \u00e9t\u00e9 \u4e2d\u6587!";
    for (int cols = 1; cols < 40; cols++) {
        kv_wrap_line big[200];
        int k = kv_format_wrap(t, -1, cols, big, 200);
        CHECK(k <= 200);
        int covered = 0;
        for (int i = 0; i < k; i++) {
            CHECK(kv_format_width(t + big[i].off, big[i].len) <= (cols < 2 ? 2 : cols));
            covered += big[i].len;
        }
        CHECK(covered <= (int)strlen(t) && covered >= (int)strlen(t) - 20);
    }
}

static void test_series(void) {
    kv_series s;
    kv_series_clear(&s);
    int valid = 1;
    kv_series_percentile(&s, 0, 50, &valid);
    CHECK(!valid);
    for (int i = 1; i <= 100; i++) kv_series_push(&s, i);
    CHECK(kv_series_percentile(&s, 0, 50, &valid) == 50 && valid);
    CHECK(kv_series_percentile(&s, 0, 99, &valid) == 99);
    CHECK(kv_series_percentile(&s, 10, 50, &valid) == 95); /* the newest 10: 91..100 */
    double out[4];
    CHECK(kv_series_last(&s, out, 4) == 4 && out[0] == 97 && out[3] == 100);
    /* Wrap-around keeps order. */
    for (int i = 0; i < KV_SERIES_CAP + 3; i++) kv_series_push(&s, i);
    CHECK(s.n == KV_SERIES_CAP);
    CHECK(kv_series_last(&s, out, 2) == 2 && out[0] == KV_SERIES_CAP + 1 && out[1] == KV_SERIES_CAP + 2);
}

TEST_MAIN(T(test_bytes), T(test_durations), T(test_counts_rates), T(test_bars), T(test_stacked),
          T(test_sparkline), T(test_width_fit), T(test_wrap), T(test_series))
