/* json.c - strict JSON reader (recursive descent with a depth limit, nodes
 * in one arena per document) and streaming writer. The reader takes
 * untrusted files, so every byte is checked and errors carry line:column. */
#include "json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../base/utf8.h"
#include "../base/vec.h"

struct kv_json {
    kv_json_type type;
    union {
        int b;
        double num;
        struct {
            char *s;    /* NUL-terminated */
            size_t len; /* bytes, embedded NULs included */
        } str;
        struct {
            kv_json *items; /* (n) element / member values */
            char **keys;    /* objects: (n) member keys */
            size_t *klens;  /* objects: (n) key byte lengths */
            size_t n;
        } c;
    } u;
};

/* ---- arena ---- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[]; /* cap bytes */
} chunk;

/* A document: the root node first, so kv_json_free can find the arena. */
typedef struct jdoc {
    kv_json root;
    chunk *chunks;
} jdoc;

static void *arena_alloc(chunk **head, size_t n) {
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (!n) n = sizeof(max_align_t);
    chunk *c = *head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = *head;
        c->used = 0;
        c->cap = cap;
        *head = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    return p;
}

static void arena_free(chunk *c) {
    while (c) {
        chunk *n = c->next;
        free(c);
        c = n;
    }
}

/* ---- reader ---- */

typedef struct member {
    char *key;
    size_t klen;
} member;

typedef struct parser {
    const unsigned char *s;
    size_t len, pos;
    chunk *arena;
    /* Values of unfinished containers wait here until their container closes
     * and copies them into the arena, so each container is one array. */
    kv_json *stack;
    member *keys;
    size_t sp, ksp, cap, kcap;
    char *buf; /* string / number scratch */
    size_t bcap;
    const char *name;
    int first_line;
    size_t err_pos;
    const char *err_msg;
    char err_extra[80];
    int nomem;
} parser;

static int fail(parser *P, size_t pos, const char *msg) {
    if (!P->err_msg) {
        P->err_pos = pos;
        P->err_msg = msg;
    }
    return -1;
}

static int oom(parser *P) {
    P->nomem = 1;
    return fail(P, P->pos, "out of memory");
}

static void skip_ws(parser *P) {
    while (P->pos < P->len) {
        unsigned char c = P->s[P->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        P->pos++;
    }
}

static int buf_reserve(parser *P, size_t n) {
    return kv_grow_size((void **)&P->buf, &P->bcap, n, 1) ? oom(P) : 0;
}

static int hex4(const unsigned char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v * 16 + d;
    }
    *out = v;
    return 0;
}

/* Parses a string at P->pos (on the opening quote) into arena memory. */
static int parse_string(parser *P, char **out, size_t *out_len) {
    size_t start = P->pos++;
    size_t n = 0;
    for (;;) {
        if (P->pos >= P->len) return fail(P, start, "unterminated string");
        if (buf_reserve(P, n + 8)) return -1;
        unsigned char c = P->s[P->pos];
        if (c == '"') {
            P->pos++;
            break;
        }
        if (c < 0x20) return fail(P, P->pos, "control character in string (escape it)");
        if (c == '\\') {
            if (P->pos + 1 >= P->len) return fail(P, start, "unterminated string");
            unsigned char e = P->s[P->pos + 1];
            const char *map = "\"\\/bfnrt", *rep = "\"\\/\b\f\n\r\t";
            const char *m = e ? strchr(map, e) : NULL;
            if (m) {
                P->buf[n++] = rep[m - map];
                P->pos += 2;
                continue;
            }
            if (e != 'u') return fail(P, P->pos, "invalid escape");
            unsigned cp, lo;
            if (P->pos + 6 > P->len || hex4(P->s + P->pos + 2, &cp)) return fail(P, P->pos, "invalid \\u escape");
            if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(P, P->pos, "lone low surrogate in \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (P->pos + 12 > P->len || P->s[P->pos + 6] != '\\' || P->s[P->pos + 7] != 'u' ||
                    hex4(P->s + P->pos + 8, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return fail(P, P->pos, "high surrogate not followed by a low surrogate");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                P->pos += 6;
            }
            P->pos += 6;
            n += kv_utf8_encode(cp, P->buf + n);
            continue;
        }
        size_t l = kv_utf8_valid_len(P->s + P->pos, P->len - P->pos);
        if (!l) return fail(P, P->pos, "invalid UTF-8 in string");
        memcpy(P->buf + n, P->s + P->pos, l);
        n += l;
        P->pos += l;
    }
    char *s = arena_alloc(&P->arena, n + 1);
    if (!s) return oom(P);
    memcpy(s, P->buf, n);
    s[n] = '\0';
    *out = s;
    *out_len = n;
    return 0;
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int parse_number(parser *P, double *out) {
    size_t start = P->pos, i = P->pos;
    const unsigned char *s = P->s;
    if (i < P->len && s[i] == '-') i++;
    if (i >= P->len || !is_digit(s[i])) return fail(P, start, "invalid number");
    if (s[i] == '0') {
        i++;
        if (i < P->len && is_digit(s[i])) return fail(P, start, "leading zero in number");
    } else {
        while (i < P->len && is_digit(s[i])) i++;
    }
    if (i < P->len && s[i] == '.') {
        i++;
        if (i >= P->len || !is_digit(s[i])) return fail(P, i, "digit expected after '.'");
        while (i < P->len && is_digit(s[i])) i++;
    }
    if (i < P->len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < P->len && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= P->len || !is_digit(s[i])) return fail(P, i, "digit expected in exponent");
        while (i < P->len && is_digit(s[i])) i++;
    }
    size_t n = i - start;
    if (buf_reserve(P, n + 1)) return -1;
    memcpy(P->buf, s + start, n);
    P->buf[n] = '\0';
    double v = strtod(P->buf, NULL);
    if (!isfinite(v)) return fail(P, start, "number out of range");
    *out = v;
    P->pos = i;
    return 0;
}

static int push(parser *P, const kv_json *v) {
    if (kv_grow_size((void **)&P->stack, &P->cap, P->sp + 1, sizeof *P->stack)) return oom(P);
    P->stack[P->sp++] = *v;
    return 0;
}

static int push_key(parser *P, char *k, size_t klen) {
    if (kv_grow_size((void **)&P->keys, &P->kcap, P->ksp + 1, sizeof *P->keys)) return oom(P);
    P->keys[P->ksp].key = k;
    P->keys[P->ksp++].klen = klen;
    return 0;
}

static int key_cmp(const void *a, const void *b) {
    const member *x = *(const member *const *)a, *y = *(const member *const *)b;
    size_t n = x->klen < y->klen ? x->klen : y->klen;
    int c = memcmp(x->key, y->key, n);
    return c ? c : (x->klen > y->klen) - (x->klen < y->klen);
}

/* Finds a duplicate among keys[0..n): pairwise for small objects, sorted
 * otherwise so a hostile file with many keys stays O(n log n). */
static const member *find_duplicate(parser *P, const member *keys, size_t n) {
    if (n < 2) return NULL;
    if (n <= 16) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = 0; j < i; j++)
                if (keys[i].klen == keys[j].klen && !memcmp(keys[i].key, keys[j].key, keys[i].klen)) return &keys[i];
        return NULL;
    }
    const member **idx = malloc(n * sizeof *idx);
    if (!idx) {
        oom(P);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) idx[i] = &keys[i];
    qsort(idx, n, sizeof *idx, key_cmp);
    const member *dup = NULL;
    for (size_t i = 1; i < n && !dup; i++)
        if (!key_cmp(&idx[i - 1], &idx[i])) dup = idx[i];
    free(idx);
    return dup;
}

static int parse_value(parser *P, kv_json *out, int depth);

/* Moves the top n stack values (and keys) into arena arrays of *out. */
static int close_container(parser *P, kv_json *out, size_t base, size_t kbase, int is_object) {
    size_t n = P->sp - base;
    out->u.c.n = n;
    out->u.c.items = NULL;
    out->u.c.keys = NULL;
    out->u.c.klens = NULL;
    if (n) {
        out->u.c.items = arena_alloc(&P->arena, n * sizeof(kv_json));
        if (!out->u.c.items) return oom(P);
        memcpy(out->u.c.items, P->stack + base, n * sizeof(kv_json));
    }
    if (is_object && n) {
        out->u.c.keys = arena_alloc(&P->arena, n * sizeof(char *));
        out->u.c.klens = arena_alloc(&P->arena, n * sizeof(size_t));
        if (!out->u.c.keys || !out->u.c.klens) return oom(P);
        for (size_t i = 0; i < n; i++) {
            out->u.c.keys[i] = P->keys[kbase + i].key;
            out->u.c.klens[i] = P->keys[kbase + i].klen;
        }
    }
    P->sp = base;
    P->ksp = kbase;
    return 0;
}

static int parse_container(parser *P, kv_json *out, int depth, int is_object) {
    size_t open = P->pos++;
    if (depth >= KV_JSON_MAX_DEPTH) return fail(P, open, "nesting deeper than 64 levels");
    size_t base = P->sp, kbase = P->ksp;
    char close = is_object ? '}' : ']';
    out->type = is_object ? KV_JSON_OBJECT : KV_JSON_ARRAY;
    skip_ws(P);
    if (P->pos < P->len && P->s[P->pos] == close) {
        P->pos++;
        return close_container(P, out, base, kbase, is_object);
    }
    for (;;) {
        skip_ws(P);
        if (is_object) {
            if (P->pos >= P->len) return fail(P, P->pos, "unexpected end of input in object");
            if (P->s[P->pos] != '"') return fail(P, P->pos, "expected a string key");
            char *k;
            size_t kl;
            if (parse_string(P, &k, &kl) || push_key(P, k, kl)) return -1;
            skip_ws(P);
            if (P->pos >= P->len || P->s[P->pos] != ':') return fail(P, P->pos, "expected ':' after key");
            P->pos++;
        }
        kv_json v;
        if (parse_value(P, &v, depth + 1) || push(P, &v)) return -1;
        skip_ws(P);
        if (P->pos >= P->len)
            return fail(P, P->pos, is_object ? "unexpected end of input in object" : "unexpected end of input in array");
        unsigned char c = P->s[P->pos];
        if (c == ',') {
            P->pos++;
            skip_ws(P);
            if (P->pos < P->len && P->s[P->pos] == close) return fail(P, P->pos, "trailing comma");
            continue;
        }
        if (c == close) {
            P->pos++;
            break;
        }
        return fail(P, P->pos, is_object ? "expected ',' or '}' in object" : "expected ',' or ']' in array");
    }
    if (is_object) {
        const member *dup = find_duplicate(P, P->keys + kbase, P->ksp - kbase);
        if (P->nomem) return -1;
        if (dup) {
            snprintf(P->err_extra, sizeof P->err_extra, "duplicate key '%.40s'", dup->key);
            return fail(P, open, P->err_extra);
        }
    }
    return close_container(P, out, base, kbase, is_object);
}

static int literal(parser *P, const char *word) {
    size_t n = strlen(word);
    if (P->len - P->pos < n || memcmp(P->s + P->pos, word, n)) return fail(P, P->pos, "invalid literal");
    P->pos += n;
    return 0;
}

static int parse_value(parser *P, kv_json *out, int depth) {
    skip_ws(P);
    memset(out, 0, sizeof *out);
    if (P->pos >= P->len) return fail(P, P->pos, "unexpected end of input (a value is due)");
    unsigned char c = P->s[P->pos];
    switch (c) {
    case '{': return parse_container(P, out, depth, 1);
    case '[': return parse_container(P, out, depth, 0);
    case '"':
        out->type = KV_JSON_STRING;
        return parse_string(P, &out->u.str.s, &out->u.str.len);
    case 't':
        out->type = KV_JSON_BOOL;
        out->u.b = 1;
        return literal(P, "true");
    case 'f':
        out->type = KV_JSON_BOOL;
        return literal(P, "false");
    case 'n':
        out->type = KV_JSON_NULL;
        return literal(P, "null");
    default:
        if (c == '-' || is_digit(c)) {
            out->type = KV_JSON_NUMBER;
            return parse_number(P, &out->u.num);
        }
        return fail(P, P->pos, "unexpected character");
    }
}

kv_json *kv_json_parse_named(const char *text, size_t len, const char *name, int first_line, kv_err *err) {
    if (!text && len) {
        kv_err_set(err, KV_ERR_INVAL, "kv_json_parse: NULL text");
        return NULL;
    }
    parser P = {.s = (const unsigned char *)(text ? text : ""), .len = len, .name = name, .first_line = first_line};
    jdoc *doc = NULL;
    kv_json root;
    if (parse_value(&P, &root, 0) == 0) {
        skip_ws(&P);
        if (P.pos < P.len) fail(&P, P.pos, "trailing characters after the value");
    }
    if (!P.err_msg) {
        doc = malloc(sizeof *doc);
        if (!doc) oom(&P);
        else {
            doc->root = root;
            doc->chunks = P.arena;
            P.arena = NULL;
        }
    }
    if (P.err_msg) {
        size_t line = 0, col = 1;
        for (size_t i = 0; i < P.err_pos && i < P.len; i++) {
            if (P.s[i] == '\n') line++, col = 1;
            else col++;
        }
        line += (size_t)(first_line > 0 ? first_line : 1);
        int code = P.nomem ? KV_ERR_NOMEM : KV_ERR_FORMAT;
        char near[32] = "";
        if (!P.nomem && P.err_pos < P.len && P.s[P.err_pos] >= 0x20 && P.s[P.err_pos] < 0x7F)
            snprintf(near, sizeof near, " at '%c'", P.s[P.err_pos]);
        else if (!P.nomem && P.err_pos >= P.len && strncmp(P.err_msg, "unexpected end", 14))
            snprintf(near, sizeof near, " at end of input");
        if (name) kv_err_set(err, code, "%s:%zu:%zu: %s%s", name, line, col, P.err_msg, near);
        else kv_err_set(err, code, "line %zu, column %zu: %s%s", line, col, P.err_msg, near);
    } else {
        kv_err_clear(err);
    }
    arena_free(P.arena);
    free(P.stack);
    free(P.keys);
    free(P.buf);
    return doc ? &doc->root : NULL;
}

kv_json *kv_json_parse(const char *text, size_t len, kv_err *err) {
    return kv_json_parse_named(text, len, NULL, 1, err);
}

void kv_json_free(kv_json *v) {
    if (!v) return;
    jdoc *d = (jdoc *)(void *)v; /* the root is the first member of its jdoc */
    arena_free(d->chunks);
    free(d);
}

kv_json_type kv_json_type_of(const kv_json *v) { return v ? v->type : KV_JSON_NULL; }
int kv_json_bool(const kv_json *v) { return v && v->type == KV_JSON_BOOL ? v->u.b : 0; }
double kv_json_number(const kv_json *v) { return v && v->type == KV_JSON_NUMBER ? v->u.num : 0; }

const char *kv_json_str(const kv_json *v, size_t *len) {
    if (!v || v->type != KV_JSON_STRING) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = v->u.str.len;
    return v->u.str.s;
}

size_t kv_json_len(const kv_json *v) {
    return v && (v->type == KV_JSON_ARRAY || v->type == KV_JSON_OBJECT) ? v->u.c.n : 0;
}

const kv_json *kv_json_at(const kv_json *v, size_t i) {
    return i < kv_json_len(v) ? &v->u.c.items[i] : NULL;
}

const char *kv_json_key_at(const kv_json *v, size_t i, size_t *len) {
    if (!v || v->type != KV_JSON_OBJECT || i >= v->u.c.n) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = v->u.c.klens[i];
    return v->u.c.keys[i];
}

const kv_json *kv_json_get(const kv_json *obj, const char *key) {
    if (!obj || obj->type != KV_JSON_OBJECT || !key) return NULL;
    size_t kl = strlen(key);
    for (size_t i = 0; i < obj->u.c.n; i++)
        if (obj->u.c.klens[i] == kl && !memcmp(obj->u.c.keys[i], key, kl)) return &obj->u.c.items[i];
    return NULL;
}

/* ---- writer ---- */

void kv_json_writer_init(kv_json_writer *w, FILE *f, int pretty) {
    memset(w, 0, sizeof *w);
    w->f = f;
    w->pretty = pretty;
    if (!f) w->err = KV_ERR_INVAL;
}

static void indent(kv_json_writer *w) {
    if (!w->pretty) return;
    fputc('\n', w->f);
    for (int i = 0; i < w->depth; i++) fputs("  ", w->f);
}

/* Called before any value: checks the grammar and writes the separator. */
static int before_value(kv_json_writer *w) {
    if (w->err) return -1;
    if (w->depth == 0) {
        if (w->done) return w->err = KV_ERR_INVAL, -1; /* one value per writer */
        return 0;
    }
    if (w->kind[w->depth - 1] == 'o') {
        if (!w->want_value) return w->err = KV_ERR_INVAL, -1; /* key first */
        w->want_value = 0;
        return 0;
    }
    if (w->count[w->depth - 1]++) fputc(',', w->f);
    indent(w);
    return 0;
}

static void after_value(kv_json_writer *w) {
    if (w->depth == 0) w->done = 1;
    if (ferror(w->f) && !w->err) w->err = KV_ERR_IO;
}

static void begin(kv_json_writer *w, char kind) {
    if (before_value(w)) return;
    if (w->depth >= KV_JSON_MAX_DEPTH) {
        w->err = KV_ERR_INVAL;
        return;
    }
    fputc(kind == 'o' ? '{' : '[', w->f);
    w->kind[w->depth] = (unsigned char)kind;
    w->count[w->depth] = 0;
    w->depth++;
}

static void end(kv_json_writer *w, char kind) {
    if (w->err) return;
    if (w->depth == 0 || w->kind[w->depth - 1] != kind || w->want_value) {
        w->err = KV_ERR_INVAL;
        return;
    }
    int had = w->count[w->depth - 1];
    w->depth--;
    if (had) indent(w);
    fputc(kind == 'o' ? '}' : ']', w->f);
    after_value(w);
}

void kv_json_write_begin_object(kv_json_writer *w) { begin(w, 'o'); }
void kv_json_write_end_object(kv_json_writer *w) { end(w, 'o'); }
void kv_json_write_begin_array(kv_json_writer *w) { begin(w, 'a'); }
void kv_json_write_end_array(kv_json_writer *w) { end(w, 'a'); }

static void put_escaped(FILE *f, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', f);
    size_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
            i++;
        } else if (c < 0x20) {
            const char *e = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
            if (e) fputs(e, f);
            else fprintf(f, "\\u%04x", c);
            i++;
        } else {
            size_t l = kv_utf8_valid_len(p + i, n - i);
            if (!l) {
                fputs("\\ufffd", f);
                i++;
            } else {
                fwrite(p + i, 1, l, f);
                i += l;
            }
        }
    }
    fputc('"', f);
}

/* Keys may hold NULs (from \u0000), so they go through a length. */
static void write_key_n(kv_json_writer *w, const char *key, size_t n) {
    if (w->err) return;
    if (!key || w->depth == 0 || w->kind[w->depth - 1] != 'o' || w->want_value) {
        w->err = KV_ERR_INVAL;
        return;
    }
    if (w->count[w->depth - 1]++) fputc(',', w->f);
    indent(w);
    put_escaped(w->f, key, n);
    fputs(w->pretty ? ": " : ":", w->f);
    w->want_value = 1;
}

void kv_json_write_key(kv_json_writer *w, const char *key) { write_key_n(w, key, key ? strlen(key) : 0); }

void kv_json_write_string_n(kv_json_writer *w, const char *s, size_t n) {
    if (!s) {
        kv_json_write_null(w);
        return;
    }
    if (before_value(w)) return;
    put_escaped(w->f, s, n);
    after_value(w);
}

void kv_json_write_string(kv_json_writer *w, const char *s) { kv_json_write_string_n(w, s, s ? strlen(s) : 0); }

void kv_json_write_number(kv_json_writer *w, double v) {
    if (!isfinite(v)) {
        kv_json_write_null(w);
        return;
    }
    if (before_value(w)) return;
    char buf[40];
    if (v == floor(v) && fabs(v) < 9007199254740992.0) {
        snprintf(buf, sizeof buf, "%.0f", v);
        if (v == 0 && signbit(v)) snprintf(buf, sizeof buf, "-0");
    } else {
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, v);
            if (strtod(buf, NULL) == v) break;
        }
    }
    fputs(buf, w->f);
    after_value(w);
}

void kv_json_write_int(kv_json_writer *w, int64_t v) {
    if (before_value(w)) return;
    fprintf(w->f, "%lld", (long long)v);
    after_value(w);
}

void kv_json_write_uint(kv_json_writer *w, uint64_t v) {
    if (before_value(w)) return;
    fprintf(w->f, "%llu", (unsigned long long)v);
    after_value(w);
}

void kv_json_field_num(kv_json_writer *w, const char *key, double v) {
    kv_json_write_key(w, key);
    kv_json_write_number(w, v);
}

void kv_json_field_int(kv_json_writer *w, const char *key, int64_t v) {
    kv_json_write_key(w, key);
    kv_json_write_int(w, v);
}

void kv_json_field_uint(kv_json_writer *w, const char *key, uint64_t v) {
    kv_json_write_key(w, key);
    kv_json_write_uint(w, v);
}

void kv_json_field_str(kv_json_writer *w, const char *key, const char *v) {
    kv_json_write_key(w, key);
    kv_json_write_string(w, v);
}

void kv_json_field_bool(kv_json_writer *w, const char *key, int v) {
    kv_json_write_key(w, key);
    kv_json_write_bool(w, v);
}

void kv_json_field_ints(kv_json_writer *w, const char *key, const int64_t *v, size_t n) {
    kv_json_write_key(w, key);
    kv_json_write_begin_array(w);
    for (size_t i = 0; i < n; i++) kv_json_write_int(w, v[i]);
    kv_json_write_end_array(w);
}

void kv_json_field_uints(kv_json_writer *w, const char *key, const uint64_t *v, size_t n) {
    kv_json_write_key(w, key);
    kv_json_write_begin_array(w);
    for (size_t i = 0; i < n; i++) kv_json_write_uint(w, v[i]);
    kv_json_write_end_array(w);
}

void kv_json_write_bool(kv_json_writer *w, int v) {
    if (before_value(w)) return;
    fputs(v ? "true" : "false", w->f);
    after_value(w);
}

void kv_json_write_null(kv_json_writer *w) {
    if (before_value(w)) return;
    fputs("null", w->f);
    after_value(w);
}

void kv_json_write_value(kv_json_writer *w, const kv_json *v) {
    switch (kv_json_type_of(v)) {
    case KV_JSON_NULL: kv_json_write_null(w); break;
    case KV_JSON_BOOL: kv_json_write_bool(w, v->u.b); break;
    case KV_JSON_NUMBER: kv_json_write_number(w, v->u.num); break;
    case KV_JSON_STRING: kv_json_write_string_n(w, v->u.str.s, v->u.str.len); break;
    case KV_JSON_ARRAY:
        kv_json_write_begin_array(w);
        for (size_t i = 0; i < v->u.c.n; i++) kv_json_write_value(w, &v->u.c.items[i]);
        kv_json_write_end_array(w);
        break;
    case KV_JSON_OBJECT:
        kv_json_write_begin_object(w);
        for (size_t i = 0; i < v->u.c.n; i++) {
            write_key_n(w, v->u.c.keys[i], v->u.c.klens[i]);
            kv_json_write_value(w, &v->u.c.items[i]);
        }
        kv_json_write_end_object(w);
        break;
    }
}

int kv_json_writer_finish(kv_json_writer *w) {
    if (!w->err && w->f && ferror(w->f)) w->err = KV_ERR_IO;
    if (w->err) return w->err;
    if (!w->done || w->depth) return KV_ERR_INVAL;
    return 0;
}
