/* config_parse.c - values of the key table's settings from text and back:
 * strict scalar parsing (the whole text, no surrounding blanks), sizes with
 * units, distributions, range checks that name the key and its bounds, and
 * the exact text form dumps print. See config.h for the contracts. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GIB (1024.0 * 1024.0 * 1024.0)

/* ---- scalar parsing (strict: the whole text, no surrounding blanks) ---- */

/* Copies s into buf as a short quoted-ready excerpt: at most ~48 bytes,
 * non-printable bytes as '?', "..." when cut. */
static const char *excerpt(const char *s, char *buf, size_t cap) {
    size_t n = 0, i = 0;
    for (; s[i] && n + 4 < cap && i < 48; i++) buf[n++] = isprint((unsigned char)s[i]) ? s[i] : '?';
    if (s[i] && n + 4 <= cap) {
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n] = '\0';
    return buf;
}

static int parse_ll(const char *s, long long *out) {
    const char *p = s;
    if (*p == '+' || *p == '-') p++;
    if (!isdigit((unsigned char)*p)) return -1;
    for (const char *q = p; *q; q++)
        if (!isdigit((unsigned char)*q)) return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

static int parse_ull(const char *s, unsigned long long *out) {
    const char *p = s;
    if (*p == '+') p++;
    if (!isdigit((unsigned char)*p)) return -1;
    for (const char *q = p; *q; q++)
        if (!isdigit((unsigned char)*q)) return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

/* A decimal number: [+-]digits[.digits][e[+-]digits] or .digits; no hex,
 * no inf/nan (strtod alone takes those). */
static int parse_num(const char *s, double *out) {
    const char *p = s;
    int digits = 0;
    if (*p == '+' || *p == '-') p++;
    while (isdigit((unsigned char)*p)) p++, digits++;
    if (*p == '.') {
        p++;
        while (isdigit((unsigned char)*p)) p++, digits++;
    }
    if (!digits) return -1;
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!isdigit((unsigned char)*p)) return -1;
        while (isdigit((unsigned char)*p)) p++;
    }
    if (*p) return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (*end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

static int parse_bool(const char *s, int *out) {
    static const char *const t[] = {"true", "yes", "on", "1"};
    static const char *const f[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < KV_ARRAY_LEN(t); i++) {
        if (!strcasecmp(s, t[i])) return *out = 1, 0;
        if (!strcasecmp(s, f[i])) return *out = 0, 0;
    }
    return -1;
}

/* Sizes: digits[.digits][ ][suffix]. Fractions need a suffix (no half bytes). */
static int parse_size(const char *s, uint64_t *out) {
    static const struct {
        const char *sfx;
        uint64_t mult;
    } sfx[] = {
        {"", 1},           {"b", 1},
        {"k", 1ull << 10}, {"kib", 1ull << 10}, {"kb", 1000ull},
        {"m", 1ull << 20}, {"mib", 1ull << 20}, {"mb", 1000000ull},
        {"g", 1ull << 30}, {"gib", 1ull << 30}, {"gb", 1000000000ull},
        {"t", 1ull << 40}, {"tib", 1ull << 40}, {"tb", 1000000000000ull},
    };
    const char *p = s;
    if (!isdigit((unsigned char)*p)) return -1;
    uint64_t whole = 0;
    while (isdigit((unsigned char)*p)) {
        if (kv_mul_overflow(whole, 10, &whole) || kv_add_overflow(whole, (uint64_t)(*p - '0'), &whole))
            return -1;
        p++;
    }
    double frac = 0, scale = 0.1;
    int has_frac = 0;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p)) return -1;
        while (isdigit((unsigned char)*p)) frac += (*p++ - '0') * scale, scale *= 0.1, has_frac = 1;
    }
    int spaced = *p == ' ';
    if (spaced) p++;
    for (size_t i = spaced; i < KV_ARRAY_LEN(sfx); i++) { /* "12 " is not a size */
        if (strcasecmp(p, sfx[i].sfx)) continue;
        if (has_frac && sfx[i].mult == 1) return -1;
        uint64_t v, f = (uint64_t)llround(frac * (double)sfx[i].mult);
        if (kv_mul_overflow(whole, sfx[i].mult, &v) || kv_add_overflow(v, f, &v)) return -1;
        *out = v;
        return 0;
    }
    return -1;
}

static int name_index(const char *const *names, const char *s) {
    for (int i = 0; names && names[i]; i++)
        if (!strcmp(names[i], s)) return i;
    return -1;
}

static void names_list(const char *const *names, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; names[i] && n + 1 < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? "|" : "", names[i]);
}

/* ---- range checks ---- */

static void fmt_num(char *buf, size_t cap, double v) {
    if (fabs(v) >= 1e15 && v == floor(v)) snprintf(buf, cap, "%.0f", v);
    else snprintf(buf, cap, "%.10g", v);
}

static void fmt_size(char *buf, size_t cap, uint64_t v) {
    static const struct {
        const char *sfx;
        uint64_t mult;
    } units[] = {{"TiB", 1ull << 40}, {"GiB", 1ull << 30}, {"MiB", 1ull << 20}, {"KiB", 1ull << 10}};
    for (size_t i = 0; i < KV_ARRAY_LEN(units); i++)
        if (v >= units[i].mult && v % units[i].mult == 0) {
            snprintf(buf, cap, "%llu%s", (unsigned long long)(v / units[i].mult), units[i].sfx);
            return;
        }
    snprintf(buf, cap, "%llu", (unsigned long long)v);
}

/* Checks v against [min, max] of k (with its open ends); `name` is the
 * dotted name to report, `shown` the value as the user would write it. */
static int check_range(const kv_config_key *k, const char *name, double v, const char *shown, kv_err *err) {
    int lo_ok = (k->flags & KV_KEY_MIN_OPEN) ? v > k->min : v >= k->min;
    int hi_ok = (k->flags & KV_KEY_MAX_OPEN) ? v < k->max : v <= k->max;
    if (lo_ok && hi_ok) return 0;
    char lo[48], hi[48];
    if (k->type == KV_KEY_SIZE) {
        fmt_size(lo, sizeof lo, (uint64_t)k->min);
        fmt_size(hi, sizeof hi, (uint64_t)k->max);
    } else {
        fmt_num(lo, sizeof lo, k->min);
        fmt_num(hi, sizeof hi, k->max);
    }
    return kv_err_set(err, KV_ERR_INVAL, "%s: must be in %c%s, %s%c, got %s", name,
                      (k->flags & KV_KEY_MIN_OPEN) ? '(' : '[', lo, hi,
                      (k->flags & KV_KEY_MAX_OPEN) ? ')' : ']', shown);
}

static int check_dist(const kv_config_key *k, const kv_dist *d, kv_err *err) {
    char name[128], shown[48];
    if ((int)d->kind < 0 || d->kind > KV_DIST_LOGNORMAL)
        return kv_err_set(err, KV_ERR_INVAL, "%s.dist: unknown distribution %d", k->path, (int)d->kind);
#define RANGE(field)                                                                     \
    do {                                                                                 \
        snprintf(name, sizeof name, "%s." #field, k->path);                              \
        fmt_num(shown, sizeof shown, d->field);                                          \
        if (check_range(k, name, d->field, shown, err)) return KV_ERR_INVAL;             \
    } while (0)
    switch (d->kind) {
    case KV_DIST_FIXED: RANGE(value); break;
    case KV_DIST_UNIFORM:
        RANGE(min);
        RANGE(max);
        break;
    case KV_DIST_LOGNORMAL:
        RANGE(mean);
        RANGE(min);
        RANGE(max);
        if (!(d->sigma >= 0 && d->sigma <= 4))
            return kv_err_set(err, KV_ERR_INVAL, "%s.sigma: must be in [0, 4], got %g", k->path, d->sigma);
        break;
    }
#undef RANGE
    if (d->kind != KV_DIST_FIXED && ceil(d->min) > floor(d->max))
        return kv_err_set(err, KV_ERR_INVAL, "%s.min: %g is above %s.max (%g)", k->path, d->min, k->path,
                          d->max);
    return 0;
}

int kv_config_key_check(const kv_config_key *k, const kv_config *c, kv_err *err) {
    const char *p = (const char *)c + k->offset;
    char shown[64];
    switch (k->type) {
    case KV_KEY_INT: {
        int v;
        memcpy(&v, p, sizeof v);
        if ((k->flags & KV_KEY_AUTO) && v == KV_KEY_AUTO_VALUE) return 0;
        snprintf(shown, sizeof shown, "%d", v);
        return check_range(k, k->path, v, shown, err);
    }
    case KV_KEY_U64: return 0; /* every value is allowed */
    case KV_KEY_SIZE: {
        uint64_t v;
        memcpy(&v, p, sizeof v);
        fmt_size(shown, sizeof shown, v);
        return check_range(k, k->path, (double)v, shown, err);
    }
    case KV_KEY_DOUBLE:
    case KV_KEY_FLOAT: {
        double v;
        if (k->type == KV_KEY_FLOAT) {
            float f;
            memcpy(&f, p, sizeof f);
            v = f;
        } else {
            memcpy(&v, p, sizeof v);
        }
        if (!isfinite(v)) return kv_err_set(err, KV_ERR_INVAL, "%s: must be a finite number", k->path);
        fmt_num(shown, sizeof shown, v);
        return check_range(k, k->path, v, shown, err);
    }
    case KV_KEY_BOOL: {
        int v;
        memcpy(&v, p, sizeof v);
        if (v != 0 && v != 1) return kv_err_set(err, KV_ERR_INVAL, "%s: must be true or false", k->path);
        return 0;
    }
    case KV_KEY_STRING: {
        if (!memchr(p, '\0', k->size))
            return kv_err_set(err, KV_ERR_INVAL, "%s: not NUL-terminated", k->path);
        if ((k->flags & KV_KEY_NONEMPTY) && !p[0])
            return kv_err_set(err, KV_ERR_INVAL, "%s: must not be empty", k->path);
        if (k->names && name_index(k->names, p) < 0) {
            char list[256], ex[64];
            names_list(k->names, list, sizeof list);
            return kv_err_set(err, KV_ERR_INVAL, "%s: unknown value '%s' (expected %s)", k->path,
                              excerpt(p, ex, sizeof ex), list);
        }
        return 0;
    }
    case KV_KEY_ENUM: {
        int v, n = 0;
        memcpy(&v, p, sizeof v);
        while (k->names[n]) n++;
        if (v < 0 || v >= n)
            return kv_err_set(err, KV_ERR_INVAL, "%s: enum value %d out of range [0, %d)", k->path, v, n);
        return 0;
    }
    case KV_KEY_DIST: return check_dist(k, (const kv_dist *)(const void *)p, err);
    }
    return kv_err_set(err, KV_ERR_INVAL, "%s: unknown key type", k->path);
}

/* ---- parsing a value from text ---- */

static int bad_type(const kv_config_key *k, const char *what, const char *text, kv_err *err) {
    char ex[64];
    return kv_err_set(err, KV_ERR_INVAL, "%s: expected %s, got '%s'", k->path, what,
                      excerpt(text, ex, sizeof ex));
}

/* Parses a token count (an integer) for a DIST sub-field. */
static int parse_tokens(const kv_config_key *k, const char *field, const char *text, double *out, kv_err *err) {
    long long v;
    if (parse_ll(text, &v)) {
        char ex[64];
        return kv_err_set(err, KV_ERR_INVAL, "%s%s%s: expected an integer token count, got '%s'", k->path,
                          field ? "." : "", field ? field : "", excerpt(text, ex, sizeof ex));
    }
    *out = (double)v;
    return 0;
}

int kv_config_dist_parse(const kv_config_key *k, kv_dist *d, const char *field, const char *text,
                         kv_err *err) {
    if (!k || k->type != KV_KEY_DIST || !d || !field || !text)
        return kv_err_set(err, KV_ERR_INVAL, "kv_config_dist_parse: bad arguments");
    kv_dist t = *d;
    char name[128], shown[64];
    snprintf(name, sizeof name, "%s.%s", k->path, field);
    if (!strcmp(field, "dist")) {
        int i = name_index(k->names, text);
        if (i < 0) {
            char list[128], ex[64];
            names_list(k->names, list, sizeof list);
            return kv_err_set(err, KV_ERR_INVAL, "%s: unknown distribution '%s' (expected %s)", name,
                              excerpt(text, ex, sizeof ex), list);
        }
        t.kind = (kv_dist_kind)i;
    } else if (!strcmp(field, "value") || !strcmp(field, "min") || !strcmp(field, "max")) {
        double v;
        if (parse_tokens(k, field, text, &v, err)) return KV_ERR_INVAL;
        snprintf(shown, sizeof shown, "%.0f", v);
        if (check_range(k, name, v, shown, err)) return KV_ERR_INVAL;
        if (field[0] == 'v') t.value = v;
        else if (field[1] == 'i') t.min = v;
        else t.max = v;
    } else if (!strcmp(field, "mean") || !strcmp(field, "sigma")) {
        double v;
        if (parse_num(text, &v)) {
            char ex[64];
            return kv_err_set(err, KV_ERR_INVAL, "%s: expected a number, got '%s'", name,
                              excerpt(text, ex, sizeof ex));
        }
        if (field[0] == 'm') {
            fmt_num(shown, sizeof shown, v);
            if (check_range(k, name, v, shown, err)) return KV_ERR_INVAL;
            t.mean = v;
        } else {
            if (!(v >= 0 && v <= 4))
                return kv_err_set(err, KV_ERR_INVAL, "%s: must be in [0, 4], got %g", name, v);
            t.sigma = v;
        }
    } else {
        char ex[64];
        return kv_err_set(err, KV_ERR_INVAL, "%s: unknown field '%s' (fields: dist, value, min, max, mean, sigma)",
                          k->path, excerpt(field, ex, sizeof ex));
    }
    *d = t;
    return 0;
}

int kv_config_key_parse(const kv_config_key *k, kv_config *c, const char *text, kv_err *err) {
    if (!k || !c || !text) return kv_err_set(err, KV_ERR_INVAL, "kv_config_key_parse: bad arguments");
    char *p = (char *)c + k->offset;
    char shown[64];
    switch (k->type) {
    case KV_KEY_INT: {
        long long v;
        if ((k->flags & KV_KEY_AUTO) && !strcmp(text, "auto")) {
            int iv = KV_KEY_AUTO_VALUE;
            memcpy(p, &iv, sizeof iv);
            return 0;
        }
        if (parse_ll(text, &v))
            return bad_type(k, (k->flags & KV_KEY_AUTO) ? "an integer or auto" : "an integer", text, err);
        snprintf(shown, sizeof shown, "%lld", v);
        if (check_range(k, k->path, (double)v, shown, err)) return KV_ERR_INVAL;
        int iv = (int)v;
        memcpy(p, &iv, sizeof iv);
        return 0;
    }
    case KV_KEY_U64: {
        unsigned long long v;
        if (parse_ull(text, &v)) return bad_type(k, "a non-negative integer", text, err);
        uint64_t u = v;
        memcpy(p, &u, sizeof u);
        return 0;
    }
    case KV_KEY_SIZE: {
        uint64_t v;
        if (parse_size(text, &v))
            return bad_type(k, "a size (bytes, or a number with K, M, G, KiB, MiB, GiB, KB, MB, GB)", text, err);
        fmt_size(shown, sizeof shown, v);
        if (check_range(k, k->path, (double)v, shown, err)) return KV_ERR_INVAL;
        memcpy(p, &v, sizeof v);
        return 0;
    }
    case KV_KEY_DOUBLE:
    case KV_KEY_FLOAT: {
        double v;
        if (parse_num(text, &v)) return bad_type(k, "a number", text, err);
        if (k->type == KV_KEY_FLOAT && fabs(v) > 3.0e38) return bad_type(k, "a number", text, err);
        fmt_num(shown, sizeof shown, v);
        if (check_range(k, k->path, v, shown, err)) return KV_ERR_INVAL;
        if (k->type == KV_KEY_DOUBLE) {
            memcpy(p, &v, sizeof v);
        } else {
            float f = (float)v;
            memcpy(p, &f, sizeof f);
        }
        return 0;
    }
    case KV_KEY_BOOL: {
        int v;
        if (parse_bool(text, &v)) return bad_type(k, "true or false", text, err);
        memcpy(p, &v, sizeof v);
        return 0;
    }
    case KV_KEY_STRING: {
        size_t n = strlen(text);
        if (n >= k->size)
            return kv_err_set(err, KV_ERR_INVAL, "%s: too long (%zu bytes, at most %zu)", k->path, n, k->size - 1);
        if ((k->flags & KV_KEY_NONEMPTY) && n == 0)
            return kv_err_set(err, KV_ERR_INVAL, "%s: must not be empty", k->path);
        if ((k->flags & KV_KEY_SECRET) && !strcmp(text, KV_SECRET_SHOWN))
            return kv_err_set(err, KV_ERR_INVAL, "%s: '%s' is what a dump shows for a secret; give the real value",
                              k->path, KV_SECRET_SHOWN);
        if (k->names && name_index(k->names, text) < 0) {
            char list[256], ex[64];
            names_list(k->names, list, sizeof list);
            return kv_err_set(err, KV_ERR_INVAL, "%s: unknown value '%s' (expected %s)", k->path,
                              excerpt(text, ex, sizeof ex), list);
        }
        memcpy(p, text, n + 1);
        return 0;
    }
    case KV_KEY_ENUM: {
        int i = name_index(k->names, text);
        kv_cache_dtype d;
        if (i < 0 && k->names == kv_config_dtype_names() && kv_cache_dtype_from_name(text, &d) == 0) i = (int)d;
        if (i < 0) {
            char list[256], ex[64];
            names_list(k->names, list, sizeof list);
            return kv_err_set(err, KV_ERR_INVAL, "%s: unknown value '%s' (expected %s)", k->path,
                              excerpt(text, ex, sizeof ex), list);
        }
        memcpy(p, &i, sizeof i);
        return 0;
    }
    case KV_KEY_DIST: {
        /* A scalar is a fixed distribution; the other fields keep their
         * values so a later `.dist=lognormal` finds sensible bounds. */
        kv_dist d;
        memcpy(&d, p, sizeof d);
        double v;
        if (parse_tokens(k, NULL, text, &v, err)) return KV_ERR_INVAL;
        snprintf(shown, sizeof shown, "%.0f", v);
        if (check_range(k, k->path, v, shown, err)) return KV_ERR_INVAL;
        d.kind = KV_DIST_FIXED;
        d.value = v;
        memcpy(p, &d, sizeof d);
        return 0;
    }
    }
    return kv_err_set(err, KV_ERR_INVAL, "%s: unknown key type", k->path);
}

/* ---- formatting ---- */

/* Shortest of %.Ng that reads back to exactly v (so dumps round-trip). */
static void fmt_exact(char *buf, size_t cap, double v, int is_float) {
    for (int prec = is_float ? 6 : 15; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (is_float ? strtof(buf, NULL) == (float)v : strtod(buf, NULL) == v) return;
    }
}

const char *kv_config_key_shown(const kv_config_key *k, const kv_config *c) {
    const char *p = (const char *)c + k->offset;
    if (k->type != KV_KEY_STRING) return "";
    return (k->flags & KV_KEY_SECRET) && p[0] ? KV_SECRET_SHOWN : p;
}

int kv_config_key_format(const kv_config_key *k, const kv_config *c, char *buf, size_t cap) {
    const char *p = (const char *)c + k->offset;
    switch (k->type) {
    case KV_KEY_INT: {
        int v;
        memcpy(&v, p, sizeof v);
        if ((k->flags & KV_KEY_AUTO) && v == KV_KEY_AUTO_VALUE) return snprintf(buf, cap, "auto");
        return snprintf(buf, cap, "%d", v);
    }
    case KV_KEY_U64: {
        uint64_t v;
        memcpy(&v, p, sizeof v);
        return snprintf(buf, cap, "%llu", (unsigned long long)v);
    }
    case KV_KEY_SIZE: {
        uint64_t v;
        memcpy(&v, p, sizeof v);
        char t[48];
        fmt_size(t, sizeof t, v);
        return snprintf(buf, cap, "%s", t);
    }
    case KV_KEY_DOUBLE:
    case KV_KEY_FLOAT: {
        double v;
        if (k->type == KV_KEY_DOUBLE) {
            memcpy(&v, p, sizeof v);
        } else {
            float f;
            memcpy(&f, p, sizeof f);
            v = f;
        }
        char t[64];
        fmt_exact(t, sizeof t, v, k->type == KV_KEY_FLOAT);
        return snprintf(buf, cap, "%s", t);
    }
    case KV_KEY_BOOL: {
        int v;
        memcpy(&v, p, sizeof v);
        return snprintf(buf, cap, "%s", v ? "true" : "false");
    }
    case KV_KEY_STRING: return snprintf(buf, cap, "%.*s", (int)strnlen(p, k->size), p);
    case KV_KEY_ENUM: {
        int v, n = 0;
        memcpy(&v, p, sizeof v);
        while (k->names[n]) n++;
        return snprintf(buf, cap, "%s", v >= 0 && v < n ? k->names[v] : "?");
    }
    case KV_KEY_DIST: {
        kv_dist d;
        memcpy(&d, p, sizeof d);
        char a[64], b[64], m[64], s[64];
        fmt_exact(a, sizeof a, d.min, 0);
        fmt_exact(b, sizeof b, d.max, 0);
        switch (d.kind) {
        case KV_DIST_FIXED:
            fmt_exact(m, sizeof m, d.value, 0);
            return snprintf(buf, cap, "%s", m);
        case KV_DIST_UNIFORM: return snprintf(buf, cap, "{dist: uniform, min: %s, max: %s}", a, b);
        case KV_DIST_LOGNORMAL:
            fmt_exact(m, sizeof m, d.mean, 0);
            fmt_exact(s, sizeof s, d.sigma, 0);
            return snprintf(buf, cap, "{dist: lognormal, mean: %s, sigma: %s, min: %s, max: %s}", m, s, a, b);
        }
        return snprintf(buf, cap, "?");
    }
    }
    return snprintf(buf, cap, "?");
}

/* ---- validation ---- */

/* The largest length d can draw. */
static double dist_upper(const kv_dist *d) { return d->kind == KV_DIST_FIXED ? nearbyint(d->value) : floor(d->max); }

int kv_config_validate(const kv_config *c, kv_err *err) {
    if (!c) return kv_err_set(err, KV_ERR_INVAL, "kv_config_validate: NULL config");
    int n_keys;
    const kv_config_key *keys = kv_config_keys(&n_keys);
    for (int i = 0; i < n_keys; i++)
        if (kv_config_key_check(&keys[i], c, err)) return KV_ERR_INVAL;
    /* Consistency between keys. Each message starts with the key to change. */
    if (c->kv.memory == 0 && c->kv.blocks == 0 && c->memory.budget == 0)
        return kv_err_set(err, KV_ERR_INVAL,
                          "kv.memory: kv.memory, kv.blocks and memory.budget are all 0; set one of them");
    if (c->scheduler.preemption == KV_PREEMPT_SWAP && c->kv.swap_memory == 0)
        return kv_err_set(err, KV_ERR_INVAL,
                          "kv.swap_memory: scheduler.preemption is swap but kv.swap_memory is 0");
    if (!c->sim.synthetic[0] && (c->sim.tp > 1 || c->sim.pp > 1 || c->sim.ep > 1 || c->sim.disaggregated))
        return kv_err_set(err, KV_ERR_INVAL, "sim.tp, sim.pp, sim.ep, sim.disaggregated: only a synthetic model "
                                             "(model.synthetic) is spread over simulated devices");
    if (c->spec.method == KV_SPEC_DRAFT_MODEL && !c->spec.draft_model[0])
        return kv_err_set(err, KV_ERR_INVAL, "spec.draft_model: required when spec.method is draft_model");
    if (c->workload.arrival == KV_ARRIVAL_POISSON && !(c->workload.rate > 0))
        return kv_err_set(err, KV_ERR_INVAL, "workload.rate: must be > 0 for poisson arrivals");
    if (c->scheduler.max_seq_len > 0) {
        /* The longest request the workload can draw must fit, or the engine
         * would have to cut requests behind the user's back. */
        double plen = c->workload.prompts_file[0] ? 0 : dist_upper(&c->workload.prompt_len);
        double longest = c->workload.system_prompt_len + plen + dist_upper(&c->workload.output_len);
        if (c->workload.short_fraction > 0) {
            double splen = c->workload.prompts_file[0] ? 0 : dist_upper(&c->workload.short_prompt_len);
            longest = KV_MAX(longest, c->workload.system_prompt_len + splen + dist_upper(&c->workload.short_output_len));
        }
        if (longest > c->scheduler.max_seq_len)
            return kv_err_set(err, KV_ERR_INVAL,
                              "workload.output_len: the longest request (system_prompt_len %d + prompt_len up to %.0f"
                              " + output_len up to %.0f) exceeds scheduler.max_seq_len (%d)",
                              c->workload.system_prompt_len, plen, dist_upper(&c->workload.output_len),
                              c->scheduler.max_seq_len);
    }
    kv_err_clear(err);
    return KV_OK;
}
