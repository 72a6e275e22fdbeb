/* format.h - pure text formatting for the TUI panels (byte sizes come from
 * base/fmt.h, shared with the CLI): durations, rates, counts, bars,
 * sparklines, UTF-8 display widths and word wrapping, plus the small ring
 * buffers the panels plot from. No curses here, so every function is
 * unit-tested without a terminal (tests/tui/test_format.c).
 *
 * All kv_format_* writers behave like snprintf into (buf, cap): they never
 * write past cap, always NUL-terminate when cap > 0, and return the bytes
 * written (not counting the NUL). */
#ifndef KV_TUI_FORMAT_H
#define KV_TUI_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "../base/fmt.h" /* kv_format_bytes, shared with the CLI */

/* A duration given in ms: "N/A" when !valid or not finite, "850us",
 * "12.3ms", "1.25s", "2m05s". */
int kv_format_ms(char *buf, size_t cap, double ms, int valid);
/* "999", "1.2k", "12k", "1.2M", "3.4G". */
int kv_format_count(char *buf, size_t cap, uint64_t n);
/* A rate per second followed by unit ("tok/s"): "12.3 tok/s", "1.2k tok/s".
 * Negative or non-finite rates print "N/A". */
int kv_format_rate(char *buf, size_t cap, double per_s, const char *unit);
/* A fraction as a percentage: "12.3%", "100%", "N/A" when !valid. */
int kv_format_pct(char *buf, size_t cap, double frac, int valid);

/* A horizontal bar `width` cells wide filled to frac (clamped to [0, 1]).
 * utf8: full blocks and eighth blocks for the partial cell, spaces after;
 * otherwise '#' filled and '.' empty. Cells are always exactly `width`. */
int kv_format_bar(char *buf, size_t cap, int width, double frac, int utf8);

/* A stacked bar: n parts (fractions of the whole width, summing to at most 1)
 * drawn with glyphs[i], the rest with `rest`. Rounding keeps the total at
 * exactly `width` cells and never hides a non-zero part entirely when width
 * allows. glyphs must be ASCII. */
int kv_format_stacked_bar(char *buf, size_t cap, int width, const double *parts, const char *glyphs, int n,
                          char rest);

/* A sparkline of the last min(n, width) values of v (oldest first), one
 * cell per value, scaled between lo and hi (lo >= hi: scale to the data's
 * own min/max, with 0 as floor). utf8: the eight block heights "▁".."█";
 * otherwise " .:-=+*#%@". Non-finite values draw as a space. */
int kv_format_sparkline(char *buf, size_t cap, const double *v, int n, int width, double lo, double hi, int utf8);

/* Display columns of the UTF-8 string s (first len bytes, len < 0: to the
 * NUL). Invalid bytes and control characters count as one column each
 * (they are shown as '?'). */
int kv_format_width(const char *s, int len);
/* Bytes of the longest prefix of s[0..len) that fits in cols display
 * columns without splitting a UTF-8 sequence; *used_cols (may be NULL) gets
 * its width. */
int kv_format_prefix_fit(const char *s, int len, int cols, int *used_cols);
/* Copies src into dst cut to at most cols display columns; when it had to
 * cut, the last column becomes '~' (ASCII so every terminal shows it). */
int kv_format_fit(char *dst, size_t cap, const char *src, int cols);

/* One wrapped line: bytes [off, off + len) of the wrapped text. */
typedef struct kv_wrap_line {
    int off;
    int len;
} kv_wrap_line;

/* Word-wraps text (UTF-8, '\n' forces a break) to lines of at most cols
 * display columns, breaking after spaces when a word fits on the next line
 * and inside a word otherwise. Writes at most max_lines entries to lines
 * (may be NULL to count) and returns the total number of lines the text
 * needs (an empty text is one empty line). cols < 1 is treated as 1. */
int kv_format_wrap(const char *text, int len, int cols, kv_wrap_line *lines, int max_lines);

/* The same one line at a time (no buffer needed): begin, then next until
 * it returns 0. len must be the text's byte length. */
typedef struct kv_wrap_iter {
    int pos;  /* where the next line starts */
    int done; /* bool */
} kv_wrap_iter;
void kv_format_wrap_begin(kv_wrap_iter *it);
int kv_format_wrap_next(const char *text, int len, int cols, kv_wrap_iter *it, kv_wrap_line *line);

/* A fixed ring of recent samples (plot history, nvtop style). */
#define KV_SERIES_CAP 512
typedef struct kv_series {
    double v[KV_SERIES_CAP]; /* samples; v[(head - 1) mod cap] is the newest */
    int head;                /* next write position */
    int n;                   /* valid samples, <= KV_SERIES_CAP */
    uint64_t total;          /* samples ever pushed */
} kv_series;

void kv_series_clear(kv_series *s);
void kv_series_push(kv_series *s, double x);
/* Copies the newest min(n, s->n) samples, oldest first, into out; returns
 * how many. */
int kv_series_last(const kv_series *s, double *out, int n);
/* Percentile p in [0, 100] of the newest min(window, s->n) samples
 * (window <= 0: all), by nearest rank; returns 0 with *valid = 0 when
 * there are no samples. */
double kv_series_percentile(const kv_series *s, int window, double p, int *valid);

#endif
