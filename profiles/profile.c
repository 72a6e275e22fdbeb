/* profile.c - YAML profiles (libyaml document API) and --set overrides into
 * a kv_config, through the key table of engine/config.c. Everything is
 * parsed into a working copy that replaces the caller's config only when
 * the whole input (and then kv_config_validate) succeeded. */
#include "profile.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "../base/file.h"
#include "../base/utf8.h"

#define PROFILE_MAX_BYTES (16u << 20) /* a profile is a page of text; refuse anything huge */
#define KEY_MAX 256                   /* longest dotted key we build */

/* Where a key's current value came from, to point validation errors at it. */
typedef struct key_origin {
    int line, col;  /* 1-based position of the value in the profile; 0 = not from the profile */
    int set_index;  /* index of the --set that last wrote it; -1 = none */
} key_origin;

typedef struct loader {
    const char *name;   /* input name for messages ("profiles/x.yaml", "--set a=b") */
    int with_pos;       /* prefix messages with name:line:column (0: with name only) */
    yaml_document_t *doc;
    kv_config *cfg;     /* the working copy being filled */
    key_origin *origin; /* (n_keys) or NULL */
    kv_err *err;
} loader;

static int key_index(const kv_config_key *k) {
    int n;
    const kv_config_key *all = kv_config_keys(&n);
    return (int)(k - all);
}

/* Reports an error at mark m: "name:line:col: message". */
__attribute__((format(printf, 4, 5))) static int at(loader *L, yaml_mark_t m, int code, const char *fmt, ...) {
    char msg[sizeof L->err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (L->with_pos)
        return kv_err_set(L->err, code, "%s:%zu:%zu: %s", L->name, m.line + 1, m.column + 1, msg);
    return kv_err_set(L->err, code, "%s: %s", L->name, msg);
}

/* ---- suggestions ---- */

/* Edit distance counting a swap of two neighbours as one edit (optimal
 * string alignment), so "mena" is nearer "mean" than "min". Three rolling
 * rows; long words are not typos of our keys. */
static int edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n >= 96 || m >= 96) return 1000;
    int r0[97], r1[97], r2[97], *pp = r0, *p = r1, *c = r2;
    for (size_t j = 0; j <= m; j++) p[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        c[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            int v = p[j - 1] + (a[i - 1] != b[j - 1]);
            v = KV_MIN(v, p[j] + 1);
            v = KV_MIN(v, c[j - 1] + 1);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) v = KV_MIN(v, pp[j - 2] + 1);
            c[j] = v;
        }
        int *t = pp;
        pp = p, p = c, c = t;
    }
    return p[m];
}

static const char *leaf_of(const char *path) {
    const char *d = strrchr(path, '.');
    return d ? d + 1 : path;
}

/* Finds the known name closest to `word` among cands[0..n) (stride-free
 * list of strings); also takes a candidate whose last component equals
 * word's ("block_size" -> "kv.block_size"). Returns NULL when nothing is
 * close enough to be a likely typo. */
static const char *closest(const char *word, const char *const *cands, int n) {
    const char *best = NULL;
    int best_d = 1000;
    size_t wl = strlen(word);
    int limit = wl / 4 > 2 ? (int)(wl / 4) : 2;
    for (int i = 0; i < n; i++) {
        int d;
        size_t cl = strlen(cands[i]);
        if (strcmp(leaf_of(word), leaf_of(cands[i])) == 0 && strchr(cands[i], '.')) d = 1;
        else if ((cl > wl ? cl - wl : wl - cl) > (size_t)limit) continue; /* cannot be close enough */
        else d = edit_distance(word, cands[i]);
        if (d < best_d) best_d = d, best = cands[i];
    }
    return (best && best_d <= limit && (size_t)best_d < wl) ? best : NULL;
}

/* Suggests the known name nearest `word`: key paths, section names and
 * distribution fields ("workload.prompt_len.mean"). */
static void suggestion(const char *word, char *buf, size_t cap) {
    enum { MAX_NAMES = 160, NAME_LEN = 80 };
    char store[MAX_NAMES][NAME_LEN]; /* built names (sections, distribution fields) */
    const char *names[MAX_NAMES];
    int n, m = 0, ns = 0;
    const kv_config_key *keys = kv_config_keys(&n);
    const char *const *fields = kv_config_dist_fields();
    for (int i = 0; i < n && m < MAX_NAMES; i++) {
        names[m++] = keys[i].path;
        if (keys[i].type == KV_KEY_DIST)
            for (int f = 0; fields[f] && m < MAX_NAMES && ns < MAX_NAMES; f++) {
                snprintf(store[ns], NAME_LEN, "%s.%s", keys[i].path, fields[f]);
                names[m++] = store[ns++];
            }
        const char *d = strrchr(keys[i].path, '.');
        if (!d || d - keys[i].path >= NAME_LEN || ns >= MAX_NAMES || m >= MAX_NAMES) continue;
        snprintf(store[ns], NAME_LEN, "%.*s", (int)(d - keys[i].path), keys[i].path);
        int dup = 0;
        for (int j = 0; j < m && !dup; j++) dup = !strcmp(names[j], store[ns]);
        if (!dup) names[m++] = store[ns++];
    }
    const char *s = closest(word, names, m);
    if (s) snprintf(buf, cap, " (did you mean '%s'?)", s);
    else buf[0] = '\0';
}

/* True when `full` names a section: some key path continues it with '.'. */
static int is_section(const char *full) {
    int n;
    const kv_config_key *keys = kv_config_keys(&n);
    size_t l = strlen(full);
    for (int i = 0; i < n; i++)
        if (!strncmp(keys[i].path, full, l) && keys[i].path[l] == '.') return 1;
    return 0;
}

/* ---- values ---- */

static const char *expected_what(const kv_config_key *k, char *buf, size_t cap) {
    switch (k->type) {
    case KV_KEY_INT:
    case KV_KEY_U64: return "an integer";
    case KV_KEY_SIZE: return "a size";
    case KV_KEY_DOUBLE:
    case KV_KEY_FLOAT: return "a number";
    case KV_KEY_BOOL: return "true or false";
    case KV_KEY_STRING: return "a string";
    case KV_KEY_DIST: return "an integer or a {dist: ...} mapping";
    case KV_KEY_ENUM: {
        size_t n = (size_t)snprintf(buf, cap, "one of ");
        for (int i = 0; k->names[i] && n < cap; i++)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? "|" : "", k->names[i]);
        return buf;
    }
    }
    return "a value";
}

static const char *node_what(const yaml_node_t *n) {
    switch (n->type) {
    case YAML_MAPPING_NODE: return "a mapping";
    case YAML_SEQUENCE_NODE: return "a list";
    default: return "a value";
    }
}

static int is_null_scalar(const yaml_node_t *n) {
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
    const char *s = (const char *)n->data.scalar.value;
    return !s[0] || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

/* The text of a scalar node; error when it hides a NUL ("\0" escape). */
static int scalar_text(loader *L, const yaml_node_t *n, const char *what, const char **out) {
    const char *s = (const char *)n->data.scalar.value;
    if (strlen(s) != n->data.scalar.length)
        return at(L, n->start_mark, KV_ERR_INVAL, "%s: contains a NUL character", what);
    *out = s;
    return 0;
}

static void note_origin(loader *L, const kv_config_key *k, const yaml_node_t *v) {
    if (!L->origin) return;
    key_origin *o = &L->origin[key_index(k)];
    o->line = (int)v->start_mark.line + 1;
    o->col = (int)v->start_mark.column + 1;
    o->set_index = -1;
}

/* A distribution written as a mapping: {dist: lognormal, mean: 128, ...}.
 * `dist` is required, and so are the fields that kind reads; fields left
 * out keep their current values (min/max of a lognormal, say). */
static int set_dist_map(loader *L, const kv_config_key *k, yaml_node_t *map) {
    const char *const *fields = kv_config_dist_fields();
    kv_dist d;
    memcpy(&d, (char *)L->cfg + k->offset, sizeof d);
    unsigned given = 0;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(L->doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(L->doc, p->value);
        if (!kn || !vn) return at(L, map->start_mark, KV_ERR_FORMAT, "%s: broken YAML node", k->path);
        if (kn->type != YAML_SCALAR_NODE)
            return at(L, kn->start_mark, KV_ERR_INVAL, "%s: field names must be plain words, got %s", k->path,
                      node_what(kn));
        const char *f = "";
        if (scalar_text(L, kn, k->path, &f)) return KV_ERR_INVAL;
        int fi = -1;
        for (int i = 0; fields[i]; i++)
            if (!strcmp(fields[i], f)) fi = i;
        if (fi < 0) {
            int nf = 0;
            while (fields[nf]) nf++;
            const char *s = closest(f, fields, nf);
            char sug[96] = "";
            if (s) snprintf(sug, sizeof sug, " (did you mean '%s'?)", s);
            return at(L, kn->start_mark, KV_ERR_INVAL, "%s: unknown field '%.64s'%s", k->path, f, sug);
        }
        if (given & (1u << fi))
            return at(L, kn->start_mark, KV_ERR_INVAL, "%s.%s: duplicate key", k->path, f);
        given |= 1u << fi;
        if (vn->type != YAML_SCALAR_NODE || is_null_scalar(vn))
            return at(L, vn->start_mark, KV_ERR_INVAL, "%s.%s: expected %s, got %s", k->path, f,
                      fi == 0 ? "fixed|uniform|lognormal" : "a number",
                      vn->type == YAML_SCALAR_NODE ? "nothing" : node_what(vn));
        const char *text = "";
        if (scalar_text(L, vn, k->path, &text)) return KV_ERR_INVAL;
        kv_err inner;
        if (kv_config_dist_parse(k, &d, f, text, &inner))
            return at(L, vn->start_mark, KV_ERR_INVAL, "%s", inner.msg);
    }
    /* fields: 0 dist, 1 value, 2 min, 3 max, 4 mean, 5 sigma */
    if (!(given & 1u))
        return at(L, map->start_mark, KV_ERR_INVAL, "%s: missing 'dist: fixed|uniform|lognormal'", k->path);
    static const unsigned need[] = {[KV_DIST_FIXED] = 1u << 1, [KV_DIST_UNIFORM] = (1u << 2) | (1u << 3),
                                    [KV_DIST_LOGNORMAL] = (1u << 4) | (1u << 5)};
    unsigned miss = need[d.kind] & ~given;
    for (int i = 0; fields[i]; i++)
        if (miss & (1u << i))
            return at(L, map->start_mark, KV_ERR_INVAL, "%s: dist %s needs '%s'", k->path, k->names[d.kind],
                      fields[i]);
    kv_config tmp = *L->cfg;
    memcpy((char *)&tmp + k->offset, &d, sizeof d);
    kv_err inner;
    if (kv_config_key_check(k, &tmp, &inner)) return at(L, map->start_mark, KV_ERR_INVAL, "%s", inner.msg);
    memcpy((char *)L->cfg + k->offset, &d, sizeof d);
    note_origin(L, k, map);
    return 0;
}

static int set_value(loader *L, const kv_config_key *k, yaml_node_t *v) {
    if (k->type == KV_KEY_DIST && v->type == YAML_MAPPING_NODE) return set_dist_map(L, k, v);
    char what[256];
    if (v->type != YAML_SCALAR_NODE)
        return at(L, v->start_mark, KV_ERR_INVAL, "%s: expected %s, got %s", k->path,
                  expected_what(k, what, sizeof what), node_what(v));
    const char *text = "";
    if (is_null_scalar(v)) {
        if (k->type != KV_KEY_STRING)
            return at(L, v->start_mark, KV_ERR_INVAL, "%s: expected %s, got nothing", k->path,
                      expected_what(k, what, sizeof what));
        text = "";
    } else if (scalar_text(L, v, k->path, &text)) {
        return KV_ERR_INVAL;
    }
    kv_err inner;
    if (kv_config_key_parse(k, L->cfg, text, &inner)) return at(L, v->start_mark, KV_ERR_INVAL, "%s", inner.msg);
    note_origin(L, k, v);
    return 0;
}

/* Walks one mapping whose keys continue `prefix` ("" at the top, "kv." in
 * the kv section). */
static int walk_mapping(loader *L, yaml_node_t *map, const char *prefix) {
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(L->doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(L->doc, p->value);
        if (!kn || !vn) return at(L, map->start_mark, KV_ERR_FORMAT, "broken YAML node");
        if (kn->type != YAML_SCALAR_NODE)
            return at(L, kn->start_mark, KV_ERR_INVAL, "keys must be plain names, got %s", node_what(kn));
        const char *key = "";
        if (scalar_text(L, kn, "key", &key)) return KV_ERR_INVAL;
        char full[KEY_MAX];
        int fl = snprintf(full, sizeof full, "%s%s", prefix, key);
        /* Duplicates: libyaml keeps both; a profile that says a key twice
         * almost always has a stale line. */
        for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++) {
            yaml_node_t *qk = yaml_document_get_node(L->doc, q->key);
            if (qk && qk->type == YAML_SCALAR_NODE && !strcmp((const char *)qk->data.scalar.value, key))
                return at(L, kn->start_mark, KV_ERR_INVAL, "duplicate key '%.200s' (first at line %zu)", full,
                          qk->start_mark.line + 1);
        }
        const kv_config_key *k = fl < (int)sizeof full ? kv_config_key_find(full) : NULL;
        if (k) {
            if (set_value(L, k, vn)) return L->err ? L->err->code : KV_ERR_INVAL;
        } else if (fl < (int)sizeof full && key[0] && is_section(full)) {
            if (vn->type == YAML_MAPPING_NODE) {
                char sub[KEY_MAX];
                if (snprintf(sub, sizeof sub, "%s.", full) >= (int)sizeof sub)
                    return at(L, kn->start_mark, KV_ERR_INVAL, "key too long");
                int rc = walk_mapping(L, vn, sub);
                if (rc) return rc;
            } else if (!is_null_scalar(vn)) { /* "kv:" with every line commented out is fine */
                return at(L, vn->start_mark, KV_ERR_INVAL, "%s: is a section; expected a mapping of its keys, got %s",
                          full, node_what(vn));
            }
        } else {
            char sug[160];
            suggestion(full, sug, sizeof sug);
            return at(L, kn->start_mark, KV_ERR_INVAL, "unknown key '%.200s'%s", full, sug);
        }
    }
    return 0;
}

/* libyaml's own error, with a position. Reader errors (bad UTF-8) carry a
 * byte offset, which we turn into line:column. */
static int yaml_error(const yaml_parser_t *p, const char *buf, size_t len, const char *name, kv_err *err) {
    if (p->error == YAML_MEMORY_ERROR) return kv_err_set(err, KV_ERR_NOMEM, "%s: out of memory reading YAML", name);
    size_t line = 1, col = 1;
    if (p->error == YAML_READER_ERROR) {
        for (size_t i = 0; i < p->problem_offset && i < len; i++) {
            if (buf[i] == '\n') line++, col = 1;
            else col++;
        }
        return kv_err_set(err, KV_ERR_FORMAT, "%s:%zu:%zu: invalid YAML: %s", name, line, col,
                          p->problem ? p->problem : "unreadable input");
    }
    line = p->problem_mark.line + 1;
    col = p->problem_mark.column + 1;
    if (p->problem_mark.index < len && buf[p->problem_mark.index] == '\t')
        return kv_err_set(err, KV_ERR_FORMAT, "%s:%zu:%zu: invalid YAML: a tab; YAML indents with spaces only", name,
                          line, col);
    if (p->context)
        return kv_err_set(err, KV_ERR_FORMAT, "%s:%zu:%zu: invalid YAML: %s (%s at line %zu, column %zu)", name,
                          line, col, p->problem ? p->problem : "syntax error", p->context,
                          p->context_mark.line + 1, p->context_mark.column + 1);
    return kv_err_set(err, KV_ERR_FORMAT, "%s:%zu:%zu: invalid YAML: %s", name, line, col,
                      p->problem ? p->problem : "syntax error");
}

/* A profile nests three levels (sections, then distribution mappings) and
 * holds a few hundred nodes. libyaml's parser takes time quadratic in flow
 * nesting depth, so a first pass over the events refuses deep or huge
 * inputs before anything else reads them. */
#define YAML_MAX_DEPTH 16
#define YAML_MAX_EVENTS 100000

static int yaml_precheck(const char *buf, size_t len, const char *name, kv_err *err) {
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) return kv_err_set(err, KV_ERR_NOMEM, "%s: out of memory", name);
    yaml_parser_set_input_string(&parser, (const unsigned char *)buf, len);
    int depth = 0, rc = 0;
    for (long n = 0;; n++) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            rc = yaml_error(&parser, buf, len, name, err);
            break;
        }
        yaml_event_type_t t = ev.type;
        yaml_mark_t m = ev.start_mark;
        yaml_event_delete(&ev);
        if (t == YAML_STREAM_END_EVENT) break;
        if (t == YAML_SEQUENCE_START_EVENT || t == YAML_MAPPING_START_EVENT) depth++;
        if (t == YAML_SEQUENCE_END_EVENT || t == YAML_MAPPING_END_EVENT) depth--;
        if (depth > YAML_MAX_DEPTH) {
            rc = kv_err_set(err, KV_ERR_FORMAT, "%s:%zu:%zu: nested deeper than %d levels; not a profile", name,
                            m.line + 1, m.column + 1, YAML_MAX_DEPTH);
            break;
        }
        if (n > YAML_MAX_EVENTS) {
            rc = kv_err_set(err, KV_ERR_FORMAT, "%s:%zu:%zu: more than %d YAML nodes; not a profile", name,
                            m.line + 1, m.column + 1, YAML_MAX_EVENTS);
            break;
        }
    }
    yaml_parser_delete(&parser);
    return rc;
}

/* Parses YAML text into *work (already holding the starting values). */
static int load_yaml(const char *buf, size_t len, const char *name, kv_config *work, key_origin *origin,
                     kv_err *err) {
    yaml_parser_t parser;
    yaml_document_t doc;
    int prc = yaml_precheck(buf, len, name, err);
    if (prc) return prc;
    if (!yaml_parser_initialize(&parser)) return kv_err_set(err, KV_ERR_NOMEM, "%s: out of memory", name);
    yaml_parser_set_input_string(&parser, (const unsigned char *)buf, len);
    if (!yaml_parser_load(&parser, &doc)) {
        int rc = yaml_error(&parser, buf, len, name, err);
        yaml_parser_delete(&parser);
        return rc;
    }
    loader L = {.name = name, .with_pos = 1, .doc = &doc, .cfg = work, .origin = origin, .err = err};
    int rc = 0;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root) {
        if (root->type == YAML_MAPPING_NODE) rc = walk_mapping(&L, root, "");
        else if (!is_null_scalar(root))
            rc = at(&L, root->start_mark, KV_ERR_INVAL, "a profile is a mapping of keys, got %s", node_what(root));
        if (rc == 0) { /* one document per profile */
            yaml_document_t more;
            if (!yaml_parser_load(&parser, &more)) {
                rc = yaml_error(&parser, buf, len, name, err);
            } else {
                yaml_node_t *r2 = yaml_document_get_root_node(&more);
                if (r2) rc = at(&L, r2->start_mark, KV_ERR_INVAL, "a profile is one YAML document; found a second");
                yaml_document_delete(&more);
            }
        }
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return rc;
}

/* ---- --set ---- */

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = '\0';
    return s;
}

/* A {dist: ...} flow mapping given to --set: parsed with libyaml and fed
 * to the same code as a profile's. */
static int set_dist_text(const kv_config_key *k, kv_config *work, const char *text, const char *what, kv_err *err) {
    yaml_parser_t parser;
    yaml_document_t doc;
    kv_err pre;
    if (yaml_precheck(text, strlen(text), what, &pre))
        return kv_err_set(err, KV_ERR_INVAL, "%s: %s: not a valid {dist: ...} mapping", what, k->path);
    if (!yaml_parser_initialize(&parser)) return kv_err_set(err, KV_ERR_NOMEM, "%s: out of memory", what);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
    if (!yaml_parser_load(&parser, &doc)) {
        yaml_parser_delete(&parser);
        return kv_err_set(err, KV_ERR_INVAL, "%s: %s: not a valid {dist: ...} mapping", what, k->path);
    }
    loader L = {.name = what, .with_pos = 0, .doc = &doc, .cfg = work, .err = err};
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    int rc;
    if (root && root->type == YAML_MAPPING_NODE) rc = set_dist_map(&L, k, root);
    else rc = kv_err_set(err, KV_ERR_INVAL, "%s: %s: not a valid {dist: ...} mapping", what, k->path);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return rc;
}

/* Applies one assignment to *work; *which gets the key it set. */
static int set_one(kv_config *work, const char *assignment, const kv_config_key **which, kv_err *err) {
    if (!assignment) return kv_err_set(err, KV_ERR_INVAL, "--set: NULL assignment");
    char what[160];
    snprintf(what, sizeof what, "--set %.100s%s", assignment, strlen(assignment) > 100 ? "..." : "");
    size_t n = strlen(assignment);
    char *copy = malloc(n + 1);
    if (!copy) return kv_err_set(err, KV_ERR_NOMEM, "%s: out of memory", what);
    memcpy(copy, assignment, n + 1);
    int rc = 0;
    char *eq = strchr(copy, '=');
    if (!eq) {
        rc = kv_err_set(err, KV_ERR_INVAL, "%s: expected key=value", what);
        goto done;
    }
    *eq = '\0';
    char *key = trim(copy), *val = trim(eq + 1);
    kv_err inner;
    const kv_config_key *k = kv_config_key_find(key);
    if (k) {
        if (k->type == KV_KEY_DIST && val[0] == '{') rc = set_dist_text(k, work, val, what, err);
        else if ((rc = kv_config_key_parse(k, work, val, &inner)))
            kv_err_set(err, rc, "%s: %s", what, inner.msg);
        if (!rc) *which = k;
        goto done;
    }
    char *dot = strrchr(key, '.');
    if (dot) { /* one field of a distribution: workload.prompt_len.mean */
        *dot = '\0';
        const kv_config_key *pk = kv_config_key_find(key);
        if (pk && pk->type == KV_KEY_DIST) {
            const char *const *fields = kv_config_dist_fields();
            int known = 0;
            for (int i = 0; fields[i]; i++) known |= !strcmp(fields[i], dot + 1);
            if (known) {
                kv_dist d;
                memcpy(&d, (char *)work + pk->offset, sizeof d);
                if ((rc = kv_config_dist_parse(pk, &d, dot + 1, val, &inner))) {
                    kv_err_set(err, rc, "%s: %s", what, inner.msg);
                } else {
                    memcpy((char *)work + pk->offset, &d, sizeof d);
                    *which = pk;
                }
                goto done;
            }
        }
        *dot = '.';
    }
    if (is_section(key)) {
        int nk;
        const kv_config_key *keys = kv_config_keys(&nk);
        const char *eg = "";
        for (int i = 0; i < nk && !eg[0]; i++)
            if (!strncmp(keys[i].path, key, strlen(key)) && keys[i].path[strlen(key)] == '.') eg = keys[i].path;
        rc = kv_err_set(err, KV_ERR_INVAL, "%s: '%.64s' is a section; set one of its keys, e.g. %s", what, key, eg);
    } else {
        char sug[160];
        suggestion(key, sug, sizeof sug);
        rc = kv_err_set(err, KV_ERR_INVAL, "%s: unknown key '%.100s'%s", what, key, sug);
    }
done:
    free(copy);
    return rc;
}

int kv_profile_set(kv_config *cfg, const char *assignment, kv_err *err) {
    if (!cfg) return kv_err_set(err, KV_ERR_INVAL, "kv_profile_set: NULL config");
    kv_config *work = malloc(sizeof *work);
    if (!work) return kv_err_set(err, KV_ERR_NOMEM, "--set: out of memory");
    *work = *cfg;
    const kv_config_key *k = NULL;
    int rc = set_one(work, assignment, &k, err);
    if (!rc) {
        *cfg = *work;
        kv_err_clear(err);
    }
    free(work);
    return rc;
}

/* ---- whole loads ---- */

/* The profile's bytes (NUL-terminated), at most PROFILE_MAX_BYTES. */
static int read_file(const char *path, char **out, size_t *len, kv_err *err) {
    int rc = kv_read_file(path, PROFILE_MAX_BYTES, out, len, err);
    if (rc == KV_ERR_FORMAT)
        kv_err_set(err, rc, "%s: larger than %u bytes; not a profile", path, PROFILE_MAX_BYTES);
    return rc;
}

static int is_name_char(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.'; }

/* The key a validation message is about, to point at where it was set:
 * the key the message starts with ("kv.memory: ...") when the profile or a
 * --set gave it, else the first other key the message names that was given
 * ("kv.swap_memory: scheduler.preemption is swap ..."). NULL if none. */
static const key_origin *origin_of_message(const char *msg, const key_origin *origin) {
    int n;
    const kv_config_key *keys = kv_config_keys(&n);
    const key_origin *best = NULL;
    const char *best_at = NULL;
    size_t best_len = 0;
    for (int i = 0; i < n; i++) {
        const key_origin *o = &origin[i];
        if (o->line <= 0 && o->set_index < 0) continue;
        size_t l = strlen(keys[i].path);
        for (const char *p = strstr(msg, keys[i].path); p; p = strstr(p + 1, keys[i].path)) {
            /* whole names only; "workload.prompt_len.min" names workload.prompt_len */
            if ((p > msg && is_name_char(p[-1])) || (is_name_char(p[l]) && p[l] != '.')) continue;
            if (!best || p < best_at || (p == best_at && l > best_len)) best = o, best_at = p, best_len = l;
            break;
        }
    }
    return best;
}

static int load_all(const char *buf, size_t len, const char *name, const char *const *sets, int n_sets,
                    kv_config *cfg, kv_err *err) {
    int n_keys;
    kv_config_keys(&n_keys);
    kv_config *work = malloc(sizeof *work);
    key_origin *origin = calloc((size_t)n_keys, sizeof *origin);
    int rc = 0;
    if (!work || !origin) {
        rc = kv_err_set(err, KV_ERR_NOMEM, "%s: out of memory", name ? name : "profile");
        goto done;
    }
    for (int i = 0; i < n_keys; i++) origin[i].set_index = -1;
    kv_config_default(work);
    if (buf && (rc = load_yaml(buf, len, name, work, origin, err))) goto done;
    for (int i = 0; i < n_sets; i++) {
        const kv_config_key *k = NULL;
        if ((rc = set_one(work, sets[i], &k, err))) goto done;
        origin[key_index(k)].set_index = i;
    }
    kv_err v;
    if ((rc = kv_config_validate(work, &v))) {
        const key_origin *o = origin_of_message(v.msg, origin);
        if (o && o->set_index >= 0) kv_err_set(err, rc, "--set %.100s: %s", sets[o->set_index], v.msg);
        else if (o && o->line > 0) kv_err_set(err, rc, "%s:%d:%d: %s", name, o->line, o->col, v.msg);
        else if (name) kv_err_set(err, rc, "%s: %s", name, v.msg);
        else kv_err_set(err, rc, "%s", v.msg);
        goto done;
    }
    *cfg = *work;
    kv_err_clear(err);
done:
    free(origin);
    free(work);
    return rc;
}

int kv_profile_load_mem(const char *buf, size_t len, const char *name, kv_config *cfg, kv_err *err) {
    if (!cfg || (!buf && len)) return kv_err_set(err, KV_ERR_INVAL, "kv_profile_load_mem: bad arguments");
    return load_all(buf ? buf : "", len, name ? name : "<profile>", NULL, 0, cfg, err);
}

int kv_profile_load_with_sets(const char *path, const char *const *sets, int n_sets, kv_config *cfg,
                              kv_err *err) {
    if (!cfg || n_sets < 0 || (n_sets && !sets))
        return kv_err_set(err, KV_ERR_INVAL, "kv_profile_load_with_sets: bad arguments");
    if (!path) return load_all(NULL, 0, NULL, sets, n_sets, cfg, err);
    char *buf = NULL;
    size_t len = 0;
    int rc = read_file(path, &buf, &len, err);
    if (rc) return rc;
    rc = load_all(buf, len, path, sets, n_sets, cfg, err);
    free(buf);
    return rc;
}

int kv_profile_load(const char *path, kv_config *cfg, kv_err *err) {
    if (!path) return kv_err_set(err, KV_ERR_INVAL, "kv_profile_load: NULL path");
    return kv_profile_load_with_sets(path, NULL, 0, cfg, err);
}

/* ---- dump and help ---- */

/* A YAML double-quoted string. Code points YAML does not allow raw are
 * escaped; bytes that are not UTF-8 cannot be said in YAML and become
 * U+FFFD. */
static void yaml_quote(FILE *f, const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    fputc('"', f);
    while (n) {
        uint32_t cp;
        size_t l = kv_utf8_decode(p, n, &cp);
        if (cp == KV_UTF8_INVALID) {
            fputs("\\uFFFD", f);
            p++, n--;
            continue;
        }
        if (cp == '"') fputs("\\\"", f);
        else if (cp == '\\') fputs("\\\\", f);
        else if (cp == '\n') fputs("\\n", f);
        else if (cp == '\t') fputs("\\t", f);
        else if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0xFEFF || cp == 0xFFFE || cp == 0xFFFF)
            fprintf(f, "\\u%04X", (unsigned)cp);
        else fwrite(p, 1, l, f);
        p += l, n -= l;
    }
    fputc('"', f);
}

int kv_profile_dump(const kv_config *cfg, FILE *f) {
    if (!cfg || !f) return KV_ERR_INVAL;
    int n;
    const kv_config_key *keys = kv_config_keys(&n);
    char section[KEY_MAX] = "", val[1024];
    fprintf(f, "# kvtop effective configuration; loads back as a profile\n");
    for (int i = 0; i < n; i++) {
        const kv_config_key *k = &keys[i];
        const char *dot = strrchr(k->path, '.');
        size_t sl = dot ? (size_t)(dot - k->path) : 0;
        if (sl != strlen(section) || strncmp(section, k->path, sl)) {
            memcpy(section, k->path, sl);
            section[sl] = '\0';
            if (sl) fprintf(f, "%s:\n", section);
        }
        const char *indent = sl ? "  " : "";
        fprintf(f, "%s%s: ", indent, dot ? dot + 1 : k->path);
        if (k->type == KV_KEY_STRING) {
            yaml_quote(f, kv_config_key_shown(k, cfg)); /* a secret as *** */
        } else {
            kv_config_key_format(k, cfg, val, sizeof val);
            fputs(val, f);
        }
        fputc('\n', f);
    }
    fflush(f);
    return ferror(f) ? KV_ERR_IO : 0;
}

void kv_profile_print_keys(FILE *f) {
    int n;
    const kv_config_key *keys = kv_config_keys(&n);
    kv_config def;
    kv_config_default(&def);
    fprintf(f, "Profile keys (YAML sections, or --set key=value; distributions also --set key.field=value):\n");
    for (int i = 0; i < n; i++) {
        const kv_config_key *k = &keys[i];
        char type[256], val[512];
        switch (k->type) {
        case KV_KEY_INT:
        case KV_KEY_DOUBLE:
        case KV_KEY_FLOAT:
            snprintf(type, sizeof type, "%s in %c%.10g, %.10g%c%s", kv_config_key_type_name(k->type),
                     (k->flags & KV_KEY_MIN_OPEN) ? '(' : '[', k->min, k->max,
                     (k->flags & KV_KEY_MAX_OPEN) ? ')' : ']', (k->flags & KV_KEY_AUTO) ? " or auto" : "");
            break;
        case KV_KEY_SIZE: {
            /* the bounds as a size reads them back */
            kv_config lo = def, hi = def;
            uint64_t a = (uint64_t)k->min, b = (uint64_t)k->max;
            memcpy((char *)&lo + k->offset, &a, sizeof a);
            memcpy((char *)&hi + k->offset, &b, sizeof b);
            char x[48], y[48];
            kv_config_key_format(k, &lo, x, sizeof x);
            kv_config_key_format(k, &hi, y, sizeof y);
            snprintf(type, sizeof type, "size in [%s, %s] (bytes; K/M/G = KiB/MiB/GiB, KB/MB/GB = 1000^n)", x, y);
            break;
        }
        case KV_KEY_ENUM: expected_what(k, type, sizeof type); break;
        case KV_KEY_STRING:
            if (k->names) {
                size_t m = (size_t)snprintf(type, sizeof type, "one of ");
                for (int j = 0; k->names[j] && m < sizeof type; j++)
                    m += (size_t)snprintf(type + m, sizeof type - m, "%s%s", j ? "|" : "", k->names[j]);
            } else {
                snprintf(type, sizeof type, "string");
            }
            break;
        case KV_KEY_DIST:
            snprintf(type, sizeof type, "tokens: N or {dist: fixed|uniform|lognormal, value, min, max, mean, sigma}");
            break;
        default: snprintf(type, sizeof type, "%s", kv_config_key_type_name(k->type)); break;
        }
        kv_config_key_format(k, &def, val, sizeof val);
        fprintf(f, "  %-34s %s (default %s%s%s)\n      %s\n", k->path, type, k->type == KV_KEY_STRING ? "\"" : "",
                val, k->type == KV_KEY_STRING ? "\"" : "", k->doc);
    }
}
