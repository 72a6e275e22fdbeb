/* format.c - number, bar, sparkline and UTF-8 text formatting for the TUI
 * panels (see format.h). Pure functions: no curses, no globals, no locale
 * dependence (display widths come from a small built-in table so tests give
 * the same answer everywhere). */
#include "format.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/utf8.h"

/* snprintf that returns the bytes actually written (never more than cap-1). */
static int put(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int put(char *buf, size_t cap, const char *fmt, ...) {
    if (!buf || cap == 0) return 0;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    if (n < 0) {
        buf[0] = 0;
        return 0;
    }
    return (size_t)n >= cap ? (int)cap - 1 : n;
}

int kv_format_ms(char *buf, size_t cap, double ms, int valid) {
    if (!valid || !isfinite(ms) || ms < 0) return put(buf, cap, "N/A");
    if (ms < 1.0) return put(buf, cap, "%.0fus", ms * 1000.0);
    if (ms < 10.0) return put(buf, cap, "%.2fms", ms);
    if (ms < 1000.0) return put(buf, cap, "%.1fms", ms);
    double s = ms / 1000.0;
    if (s < 60.0) return put(buf, cap, "%.2fs", s);
    long total = (long)(s + 0.5);
    if (total < 3600) return put(buf, cap, "%ldm%02lds", total / 60, total % 60);
    return put(buf, cap, "%ldh%02ldm", total / 3600, (total / 60) % 60);
}

int kv_format_count(char *buf, size_t cap, uint64_t n) {
    static const char suffix[] = {'k', 'M', 'G', 'T', 'P', 'E'};
    if (n < 1000) return put(buf, cap, "%llu", (unsigned long long)n);
    double v = (double)n;
    int u = -1;
    while (v >= 1000.0 && u < 5) {
        v /= 1000.0;
        u++;
    }
    if (v < 10.0) return put(buf, cap, "%.1f%c", floor(v * 10.0) / 10.0, suffix[u]);
    return put(buf, cap, "%.0f%c", floor(v), suffix[u]);
}

int kv_format_rate(char *buf, size_t cap, double per_s, const char *unit) {
    if (!unit) unit = "/s";
    if (!isfinite(per_s) || per_s < 0) return put(buf, cap, "N/A");
    if (per_s < 10.0) return put(buf, cap, "%.2f %s", per_s, unit);
    if (per_s < 1000.0) return put(buf, cap, "%.1f %s", per_s, unit);
    char c[16];
    kv_format_count(c, sizeof c, (uint64_t)per_s);
    return put(buf, cap, "%s %s", c, unit);
}

int kv_format_pct(char *buf, size_t cap, double frac, int valid) {
    if (!valid || !isfinite(frac)) return put(buf, cap, "N/A");
    double p = frac * 100.0;
    if (p >= 99.95 && p <= 100.0) return put(buf, cap, "100%%");
    return put(buf, cap, "%.1f%%", p);
}

/* Appends raw bytes; returns the new length (stops before cap-1). */
static int append(char *buf, size_t cap, int len, const char *s, int n) {
    if ((size_t)len + (size_t)n + 1 > cap) return -1;
    memcpy(buf + len, s, (size_t)n);
    buf[len + n] = 0;
    return len + n;
}

int kv_format_bar(char *buf, size_t cap, int width, double frac, int utf8) {
    if (!buf || cap == 0) return 0;
    buf[0] = 0;
    if (width <= 0) return 0;
    if (!isfinite(frac) || frac < 0) frac = 0;
    if (frac > 1) frac = 1;
    static const char *eighths[] = {"", "\u258F", "\u258E", "\u258D", "\u258C", "\u258B", "\u258A", "\u2589"};
    int len = 0;
    if (utf8) {
        int units = (int)lround(frac * width * 8.0);
        int full = units / 8, part = units % 8;
        for (int i = 0; i < width; i++) {
            const char *g = i < full ? "\u2588" : (i == full && part ? eighths[part] : " ");
            int r = append(buf, cap, len, g, (int)strlen(g));
            if (r < 0) break;
            len = r;
        }
    } else {
        int full = (int)lround(frac * width);
        for (int i = 0; i < width; i++) {
            int r = append(buf, cap, len, i < full ? "#" : ".", 1);
            if (r < 0) break;
            len = r;
        }
    }
    return len;
}

int kv_format_stacked_bar(char *buf, size_t cap, int width, const double *parts, const char *glyphs, int n,
                          char rest) {
    if (!buf || cap == 0) return 0;
    buf[0] = 0;
    if (width <= 0) return 0;
    if ((size_t)width + 1 > cap) width = (int)cap - 1;
    int cells[16] = {0};
    if (n > 16) n = 16;
    if (n < 0) n = 0;
    /* Largest remainder rounding over the parts, so the total is exact. */
    double sum = 0;
    for (int i = 0; i < n; i++) sum += (parts && isfinite(parts[i]) && parts[i] > 0) ? parts[i] : 0;
    double scale = sum > 1.0 ? 1.0 / sum : 1.0;
    int used = 0;
    double rem[16];
    for (int i = 0; i < n; i++) {
        double p = (parts && isfinite(parts[i]) && parts[i] > 0) ? parts[i] * scale : 0;
        double exact = p * width;
        cells[i] = (int)floor(exact);
        rem[i] = exact - cells[i];
        used += cells[i];
    }
    int target = (int)lround(sum * scale * width);
    if (target > width) target = width;
    while (used < target) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (best < 0 || rem[i] > rem[best]) best = i;
        if (best < 0) break;
        cells[best]++;
        rem[best] = -1;
        used++;
    }
    /* A non-zero part gets at least one cell when there is room: a single
     * prefill token in a decode-heavy step must stay visible. */
    for (int i = 0; i < n; i++) {
        if (cells[i] == 0 && parts && parts[i] > 0) {
            if (used < width) {
                cells[i] = 1;
                used++;
            } else {
                int big = -1;
                for (int j = 0; j < n; j++)
                    if (cells[j] > 1 && (big < 0 || cells[j] > cells[big])) big = j;
                if (big >= 0) {
                    cells[big]--;
                    cells[i] = 1;
                }
            }
        }
    }
    int len = 0;
    for (int i = 0; i < n; i++)
        for (int c = 0; c < cells[i] && len < width; c++) buf[len++] = glyphs ? glyphs[i] : '#';
    while (len < width) buf[len++] = rest;
    buf[len] = 0;
    return len;
}

int kv_format_sparkline(char *buf, size_t cap, const double *v, int n, int width, double lo, double hi, int utf8) {
    if (!buf || cap == 0) return 0;
    buf[0] = 0;
    if (!v || n <= 0 || width <= 0) return 0;
    static const char *blocks[] = {"\u2581", "\u2582", "\u2583", "\u2584", "\u2585", "\u2586", "\u2587", "\u2588"};
    static const char ascii[] = " .:-=+*#%@";
    int count = n < width ? n : width;
    const double *p = v + (n - count);
    if (lo >= hi) {
        lo = 0;
        hi = 0;
        int any = 0;
        for (int i = 0; i < count; i++) {
            if (!isfinite(p[i])) continue;
            if (!any || p[i] > hi) hi = p[i];
            if (p[i] < lo) lo = p[i];
            any = 1;
        }
        if (hi <= lo) hi = lo + 1.0;
    }
    int len = 0;
    for (int i = 0; i < count; i++) {
        double x = p[i];
        int r;
        if (!isfinite(x)) {
            r = append(buf, cap, len, " ", 1);
        } else {
            double f = (x - lo) / (hi - lo);
            if (f < 0) f = 0;
            if (f > 1) f = 1;
            if (utf8) {
                int k = (int)lround(f * 7.0);
                r = append(buf, cap, len, blocks[k], (int)strlen(blocks[k]));
            } else {
                /* Index 0 (space) is reserved for "no value": data starts at '.'. */
                int k = 1 + (int)lround(f * 8.0);
                r = append(buf, cap, len, &ascii[k], 1);
            }
        }
        if (r < 0) break;
        len = r;
    }
    return len;
}

/* ---- UTF-8 ---- */

/* Decodes one code point from s[0..len) (len >= 1) with the strict decoder;
 * returns its byte length (1 for an invalid byte, with *cp = -1). */
static int utf8_decode(const unsigned char *s, int len, long *cp) {
    uint32_t c;
    int n = (int)kv_utf8_decode(s, (size_t)len, &c);
    *cp = c == KV_UTF8_INVALID ? -1 : (long)c;
    return n;
}

/* Columns of one code point. NOTE: a small table instead of wcwidth() so
 * results do not depend on the process locale; it covers combining marks
 * and the common wide (CJK, emoji) ranges. */
static int cp_width(long cp) {
    if (cp < 0) return 1;
    if (cp < 0x20 || cp == 0x7F) return 1; /* shown as '?' */
    if ((cp >= 0x300 && cp <= 0x36F) || (cp >= 0x1AB0 && cp <= 0x1AFF) || (cp >= 0x1DC0 && cp <= 0x1DFF) ||
        (cp >= 0x200B && cp <= 0x200F) || (cp >= 0x20D0 && cp <= 0x20FF) || (cp >= 0xFE00 && cp <= 0xFE0F) ||
        (cp >= 0xFE20 && cp <= 0xFE2F))
        return 0;
    if ((cp >= 0x1100 && cp <= 0x115F) || (cp >= 0x2E80 && cp <= 0x303E) || (cp >= 0x3041 && cp <= 0xA4CF) ||
        (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0xFE30 && cp <= 0xFE4F) ||
        (cp >= 0xFF00 && cp <= 0xFF60) || (cp >= 0xFFE0 && cp <= 0xFFE6) || (cp >= 0x1F300 && cp <= 0x1F64F) ||
        (cp >= 0x1F900 && cp <= 0x1F9FF) || (cp >= 0x20000 && cp <= 0x3FFFD))
        return 2;
    return 1;
}

int kv_format_width(const char *s, int len) {
    if (!s) return 0;
    if (len < 0) len = (int)strlen(s);
    int w = 0;
    for (int i = 0; i < len;) {
        long cp;
        i += utf8_decode((const unsigned char *)s + i, len - i, &cp);
        w += cp_width(cp);
    }
    return w;
}

int kv_format_prefix_fit(const char *s, int len, int cols, int *used_cols) {
    int w = 0, i = 0;
    if (s && len < 0) len = (int)strlen(s);
    if (!s) len = 0;
    while (i < len) {
        long cp;
        int n = utf8_decode((const unsigned char *)s + i, len - i, &cp);
        int cw = cp_width(cp);
        if (w + cw > cols) break;
        w += cw;
        i += n;
    }
    if (used_cols) *used_cols = w;
    return i;
}

int kv_format_fit(char *dst, size_t cap, const char *src, int cols) {
    if (!dst || cap == 0) return 0;
    dst[0] = 0;
    if (!src || cols <= 0) return 0;
    int len = (int)strlen(src);
    int n;
    if (kv_format_width(src, len) <= cols) {
        n = len;
    } else {
        n = kv_format_prefix_fit(src, len, cols - 1, NULL);
    }
    if ((size_t)n + 2 > cap) {
        /* dst is too small: whole characters only (a byte cut could leave a
         * partial sequence that merges with the '~'), with room for it */
        n = kv_format_prefix_fit(src, len, cols - 1, NULL);
        int lim = (int)cap - 2 > 0 ? (int)cap - 2 : 0, p = 0;
        while (p < n) {
            long cp;
            int k = utf8_decode((const unsigned char *)src + p, n - p, &cp);
            if (k <= 0 || p + k > lim) break;
            p += k;
        }
        n = p;
    }
    memcpy(dst, src, (size_t)n);
    int out = n;
    if (n < len && (size_t)out + 2 <= cap) dst[out++] = '~';
    dst[out] = 0;
    return out;
}

void kv_format_wrap_begin(kv_wrap_iter *it) {
    it->pos = 0;
    it->done = 0;
}

int kv_format_wrap_next(const char *text, int len, int cols, kv_wrap_iter *it, kv_wrap_line *line) {
    if (cols < 1) cols = 1;
    if (!text) len = 0;
    if (it->done || it->pos > len) return 0;
    int p = it->pos;
    int end = p;
    while (end < len && text[end] != '\n') end++;
    if (p == end) {
        /* An empty paragraph (or an empty text) is one empty line. */
        line->off = p;
        line->len = 0;
    } else {
        int w = 0, q = p, last_space = -1;
        while (q < end) {
            long cp;
            int n = utf8_decode((const unsigned char *)text + q, end - q, &cp);
            int cw = cp_width(cp);
            if (w + cw > cols) break;
            w += cw;
            q += n;
            if (cp == ' ') last_space = q;
        }
        if (q < end) {
            if (q == p) {
                /* A character wider than the line: take it alone. */
                long cp;
                q += utf8_decode((const unsigned char *)text + q, end - q, &cp);
            } else if (last_space > p && text[q] != ' ') {
                q = last_space; /* break after the last space inside the line */
            }
        }
        line->off = p;
        line->len = q - p;
        p = q;
        /* Spaces that caused the break are not carried to the next line. */
        while (p < end && text[p] == ' ') p++;
        if (p < end) {
            it->pos = p;
            return 1;
        }
    }
    if (end < len) it->pos = end + 1;
    else it->done = 1;
    return 1;
}

int kv_format_wrap(const char *text, int len, int cols, kv_wrap_line *lines, int max_lines) {
    if (!text) len = 0;
    else if (len < 0) len = (int)strlen(text);
    kv_wrap_iter it;
    kv_format_wrap_begin(&it);
    kv_wrap_line l;
    int count = 0;
    while (kv_format_wrap_next(text, len, cols, &it, &l)) {
        if (lines && count < max_lines) lines[count] = l;
        count++;
    }
    return count;
}

/* ---- series ---- */

void kv_series_clear(kv_series *s) {
    if (!s) return;
    s->head = 0;
    s->n = 0;
    s->total = 0;
}

void kv_series_push(kv_series *s, double x) {
    if (!s) return;
    s->v[s->head] = x;
    s->head = (s->head + 1) % KV_SERIES_CAP;
    if (s->n < KV_SERIES_CAP) s->n++;
    s->total++;
}

int kv_series_last(const kv_series *s, double *out, int n) {
    if (!s || !out || n <= 0) return 0;
    int k = n < s->n ? n : s->n;
    for (int i = 0; i < k; i++) {
        int idx = (s->head - k + i + 2 * KV_SERIES_CAP) % KV_SERIES_CAP;
        out[i] = s->v[idx];
    }
    return k;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double kv_series_percentile(const kv_series *s, int window, double p, int *valid) {
    double tmp[KV_SERIES_CAP];
    int n = kv_series_last(s, tmp, window <= 0 ? KV_SERIES_CAP : window);
    if (valid) *valid = n > 0;
    if (n == 0) return 0;
    qsort(tmp, (size_t)n, sizeof tmp[0], cmp_double);
    if (p < 0) p = 0;
    if (p > 100) p = 100;
    /* Nearest rank: the smallest value with at least p% of samples <= it. */
    int rank = (int)ceil(p / 100.0 * n);
    if (rank < 1) rank = 1;
    return tmp[rank - 1];
}
