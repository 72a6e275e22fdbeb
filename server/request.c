/* request.c - strict parsing of the server's JSON request bodies into plain
 * structs. Every field is looked up in a per-endpoint list, so an unknown or
 * misspelt field is a 400 naming it; numbers are range checked against the
 * profile key table, so a request cannot set what a profile could not. */
#include "request.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/json.h"

int srv_fail(srv_error *e, int status, const char *type, const char *param, const char *code, const char *fmt, ...) {
    if (!e) return -1;
    e->status = status;
    kv_copy_str(e->type, sizeof e->type, type ? type : "invalid_request_error");
    kv_copy_str(e->param, sizeof e->param, param ? param : "");
    kv_copy_str(e->code, sizeof e->code, code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* A 400 about one field. */
#define BAD(e, param, code, ...) srv_fail(e, 400, "invalid_request_error", param, code, __VA_ARGS__)

static const char *type_name(kv_json_type t) {
    switch (t) {
    case KV_JSON_NULL: return "null";
    case KV_JSON_BOOL: return "a boolean";
    case KV_JSON_NUMBER: return "a number";
    case KV_JSON_STRING: return "a string";
    case KV_JSON_ARRAY: return "an array";
    case KV_JSON_OBJECT: return "an object";
    }
    return "?";
}

static int wrong_type(srv_error *e, const char *param, const char *want, const kv_json *v) {
    return BAD(e, param, "invalid_type", "'%s' must be %s, got %s", param, want, type_name(kv_json_type_of(v)));
}

static int is_null(const kv_json *v) { return kv_json_type_of(v) == KV_JSON_NULL; }

/* An integer in [lo, hi]. */
static int get_int(const kv_json *v, const char *param, double lo, double hi, long long *out, srv_error *e) {
    if (kv_json_type_of(v) != KV_JSON_NUMBER) return wrong_type(e, param, "an integer", v);
    double d = kv_json_number(v);
    if (d != floor(d)) return BAD(e, param, "invalid_type", "'%s' must be an integer, got %.17g", param, d);
    if (!(d >= lo && d <= hi))
        return BAD(e, param, "invalid_value", "'%s' must be in [%.0f, %.0f], got %.17g", param, lo, hi, d);
    *out = (long long)d;
    return 0;
}

static int get_bool(const kv_json *v, const char *param, int *out, srv_error *e) {
    if (kv_json_type_of(v) != KV_JSON_BOOL) return wrong_type(e, param, "a boolean", v);
    *out = kv_json_bool(v);
    return 0;
}

/* A string without NUL characters (one rule for every text the server
 * takes: C strings all the way down), copied when dst is given. */
static int get_str(const kv_json *v, const char *param, size_t max, const char **s, size_t *len, srv_error *e) {
    if (kv_json_type_of(v) != KV_JSON_STRING) return wrong_type(e, param, "a string", v);
    size_t n;
    const char *p = kv_json_str(v, &n);
    if (memchr(p, 0, n)) return BAD(e, param, "invalid_value", "'%s' contains a NUL character (U+0000)", param);
    if (n > max) return BAD(e, param, "invalid_value", "'%s' is longer than %zu bytes", param, max);
    *s = p;
    if (len) *len = n;
    return 0;
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static int nomem(srv_error *e) {
    return srv_fail(e, 500, "internal_error", NULL, "out_of_memory", "the server is out of memory");
}

/* A number checked against profile key `key`'s range (and integrality for
 * an integer key), so requests and profiles share one rule. */
static int key_num(const kv_json *v, const char *param, const char *key, double *out, srv_error *e) {
    const kv_config_key *k = kv_config_key_find(key);
    if (kv_json_type_of(v) != KV_JSON_NUMBER) return wrong_type(e, param, "a number", v);
    double d = kv_json_number(v);
    if (!k) return srv_fail(e, 500, "internal_error", param, NULL, "no profile key %s", key);
    int lo = (k->flags & KV_KEY_MIN_OPEN) ? d > k->min : d >= k->min;
    int hi = (k->flags & KV_KEY_MAX_OPEN) ? d < k->max : d <= k->max;
    if (!(isfinite(d) && lo && hi))
        return BAD(e, param, "invalid_value", "'%s' must be in %c%g, %g%c (the range of %s), got %.17g", param,
                   (k->flags & KV_KEY_MIN_OPEN) ? '(' : '[', k->min, k->max, (k->flags & KV_KEY_MAX_OPEN) ? ')' : ']',
                   key, d);
    if (k->type == KV_KEY_INT && d != floor(d))
        return BAD(e, param, "invalid_type", "'%s' must be an integer, got %.17g", param, d);
    *out = d;
    return 0;
}

static int parse_doc(const char *body, size_t len, kv_json **root, srv_error *e) {
    kv_err err;
    *root = kv_json_parse(body, len, &err);
    if (!*root) {
        if (err.code == KV_ERR_NOMEM) return nomem(e);
        return BAD(e, NULL, "invalid_json", "the body is not valid JSON: %s", err.msg);
    }
    if (kv_json_type_of(*root) != KV_JSON_OBJECT) {
        int rc = BAD(e, NULL, "invalid_type", "the body must be a JSON object, got %s",
                     type_name(kv_json_type_of(*root)));
        kv_json_free(*root);
        *root = NULL;
        return rc;
    }
    return 0;
}

/* ---- messages ---- */

/* content: a string, null (an assistant turn without text) or an array of
 * {"type": "text", "text": ...} parts, joined. */
static int parse_content(const kv_json *c, const char *param, srv_msg *m, srv_error *e) {
    char p[192];
    const char *s;
    size_t n;
    if (is_null(c)) {
        m->content = dup_n("", 0);
        return m->content ? 0 : nomem(e);
    }
    if (kv_json_type_of(c) == KV_JSON_STRING) {
        if (get_str(c, param, SIZE_MAX, &s, &n, e)) return -1;
        m->content = dup_n(s, n);
        m->len = n;
        return m->content ? 0 : nomem(e);
    }
    if (kv_json_type_of(c) != KV_JSON_ARRAY) return wrong_type(e, param, "a string or an array of text parts", c);
    size_t total = 0;
    for (size_t i = 0; i < kv_json_len(c); i++) {
        const kv_json *part = kv_json_at(c, i);
        snprintf(p, sizeof p, "%s[%zu]", param, i);
        if (kv_json_type_of(part) != KV_JSON_OBJECT) return wrong_type(e, p, "an object", part);
        const kv_json *ty = kv_json_get(part, "type"), *tx = kv_json_get(part, "text");
        const char *tys;
        char pt[256];
        snprintf(pt, sizeof pt, "%s.type", p);
        if (!ty) return BAD(e, pt, "missing_field", "'%s' is required", pt);
        if (get_str(ty, pt, 64, &tys, NULL, e)) return -1;
        if (strcmp(tys, "text"))
            return BAD(e, pt, "unsupported", "content parts of type '%s' are not supported (only \"text\")", tys);
        for (size_t k = 0; k < kv_json_len(part); k++) {
            const char *key = kv_json_key_at(part, k, NULL);
            if (strcmp(key, "type") && strcmp(key, "text")) {
                snprintf(pt, sizeof pt, "%s.%s", p, key);
                return BAD(e, pt, "unknown_field", "unrecognized field '%s'", pt);
            }
        }
        snprintf(pt, sizeof pt, "%s.text", p);
        if (!tx) return BAD(e, pt, "missing_field", "'%s' is required", pt);
        if (get_str(tx, pt, SIZE_MAX, &s, &n, e)) return -1;
        total += n;
    }
    m->content = malloc(total + 1);
    if (!m->content) return nomem(e);
    for (size_t i = 0; i < kv_json_len(c); i++) {
        size_t l;
        const char *t = kv_json_str(kv_json_get(kv_json_at(c, i), "text"), &l);
        memcpy(m->content + m->len, t, l);
        m->len += l;
    }
    m->content[m->len] = 0;
    return 0;
}

static int parse_messages(const kv_json *v, srv_msg **out, int *n_out, srv_error *e) {
    if (kv_json_type_of(v) != KV_JSON_ARRAY) return wrong_type(e, "messages", "an array", v);
    size_t n = kv_json_len(v);
    if (n == 0) return BAD(e, "messages", "invalid_value", "'messages' must not be empty");
    if (n > 65536) return BAD(e, "messages", "invalid_value", "'messages' has more than 65536 entries");
    srv_msg *m = calloc(n, sizeof *m);
    if (!m) return nomem(e);
    *out = m;
    *n_out = 0;
    char p[96], pk[128];
    for (size_t i = 0; i < n; i++) {
        const kv_json *o = kv_json_at(v, i);
        snprintf(p, sizeof p, "messages[%zu]", i);
        if (kv_json_type_of(o) != KV_JSON_OBJECT) return wrong_type(e, p, "an object", o);
        const kv_json *role = NULL, *content = NULL;
        for (size_t k = 0; k < kv_json_len(o); k++) {
            const char *key = kv_json_key_at(o, k, NULL);
            const kv_json *val = kv_json_at(o, k);
            snprintf(pk, sizeof pk, "%s.%s", p, key);
            if (!strcmp(key, "role")) role = val;
            else if (!strcmp(key, "content")) content = val;
            else if (!strcmp(key, "name")) {
                const char *s;
                if (get_str(val, pk, 256, &s, NULL, e)) return -1;
            } else if (!strcmp(key, "tool_calls") || !strcmp(key, "tool_call_id") || !strcmp(key, "function_call"))
                return BAD(e, pk, "unsupported", "'%s': tool calls are not supported", pk);
            else return BAD(e, pk, "unknown_field", "unrecognized field '%s'", pk);
        }
        snprintf(pk, sizeof pk, "%s.role", p);
        if (!role) return BAD(e, pk, "missing_field", "'%s' is required", pk);
        const char *r;
        if (get_str(role, pk, 32, &r, NULL, e)) return -1;
        if (!strcmp(r, "developer")) r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant"))
            return BAD(e, pk, "invalid_value", "'%s' must be system, developer, user or assistant, got '%s'", pk, r);
        kv_copy_str(m[i].role, sizeof m[i].role, r);
        snprintf(pk, sizeof pk, "%s.content", p);
        if (!content) return BAD(e, pk, "missing_field", "'%s' is required", pk);
        if (is_null(content) && strcmp(r, "assistant"))
            return BAD(e, pk, "invalid_type", "'%s' must be a string, got null", pk);
        (*n_out)++;
        if (parse_content(content, pk, &m[i], e)) return -1;
    }
    return 0;
}

/* ---- prompts (completions) ---- */

static int parse_ids(const kv_json *v, const char *param, int32_t **ids, int *n, srv_error *e) {
    size_t len = kv_json_len(v);
    if (len == 0) return BAD(e, param, "invalid_value", "'%s' must not be empty", param);
    if (len > SRV_MAX_TOKENS_CAP) return BAD(e, param, "invalid_value", "'%s' has too many tokens", param);
    *ids = malloc(len * sizeof **ids);
    if (!*ids) return nomem(e);
    *n = (int)len;
    char p[128];
    for (size_t i = 0; i < len; i++) {
        long long x;
        snprintf(p, sizeof p, "%s[%zu]", param, i);
        if (get_int(kv_json_at(v, i), p, 0, INT32_MAX, &x, e)) return -1;
        (*ids)[i] = (int32_t)x;
    }
    return 0;
}

/* prompt: a string, an array of strings, an array of token ids, or an
 * array of arrays of token ids. */
static int parse_prompts(const kv_json *v, srv_gen_req *r, srv_error *e) {
    kv_json_type t = kv_json_type_of(v);
    size_t n = 1;
    int flat_ids = 0;
    if (t == KV_JSON_ARRAY) {
        n = kv_json_len(v);
        if (n == 0) return BAD(e, "prompt", "invalid_value", "'prompt' must not be empty");
        flat_ids = kv_json_type_of(kv_json_at(v, 0)) == KV_JSON_NUMBER;
        if (flat_ids) n = 1;
    } else if (t != KV_JSON_STRING) {
        return wrong_type(e, "prompt", "a string, an array of strings or an array of token ids", v);
    }
    if (n > SRV_MAX_CHOICES) return BAD(e, "prompt", "invalid_value", "'prompt' holds more than %d prompts", SRV_MAX_CHOICES);
    r->prompts = calloc(n, sizeof *r->prompts);
    if (!r->prompts) return nomem(e);
    r->n_prompts = (int)n;
    if (t == KV_JSON_STRING || flat_ids) {
        if (flat_ids) return parse_ids(v, "prompt", &r->prompts[0].ids, &r->prompts[0].n_ids, e);
        const char *s;
        size_t l;
        if (get_str(v, "prompt", SIZE_MAX, &s, &l, e)) return -1;
        if (!(r->prompts[0].text = dup_n(s, l))) return nomem(e);
        r->prompts[0].len = l;
        return 0;
    }
    char p[64];
    for (size_t i = 0; i < n; i++) {
        const kv_json *x = kv_json_at(v, i);
        snprintf(p, sizeof p, "prompt[%zu]", i);
        if (kv_json_type_of(x) == KV_JSON_ARRAY) {
            if (parse_ids(x, p, &r->prompts[i].ids, &r->prompts[i].n_ids, e)) return -1;
            continue;
        }
        const char *s;
        size_t l;
        if (kv_json_type_of(x) != KV_JSON_STRING) return wrong_type(e, p, "a string or an array of token ids", x);
        if (get_str(x, p, SIZE_MAX, &s, &l, e)) return -1;
        if (!(r->prompts[i].text = dup_n(s, l))) return nomem(e);
        r->prompts[i].len = l;
    }
    return 0;
}

static int parse_stop(const kv_json *v, srv_gen_req *r, srv_error *e) {
    if (is_null(v)) return 0;
    int single = kv_json_type_of(v) == KV_JSON_STRING;
    if (!single && kv_json_type_of(v) != KV_JSON_ARRAY) return wrong_type(e, "stop", "a string or an array of strings", v);
    size_t n = single ? 1 : kv_json_len(v);
    if (n > SRV_MAX_STOP) return BAD(e, "stop", "invalid_value", "'stop' holds more than %d strings", SRV_MAX_STOP);
    if (n == 0) return 0;
    r->stop = calloc(n, sizeof *r->stop);
    if (!r->stop) return nomem(e);
    char p[32];
    for (size_t i = 0; i < n; i++) {
        const kv_json *x = single ? v : kv_json_at(v, i);
        const char *s;
        size_t l;
        if (single) snprintf(p, sizeof p, "stop");
        else snprintf(p, sizeof p, "stop[%zu]", i);
        if (get_str(x, p, SRV_MAX_STOP_LEN, &s, &l, e)) return -1;
        if (l == 0) return BAD(e, p, "invalid_value", "'%s' must not be empty", p);
        if (!(r->stop[i] = dup_n(s, l))) return nomem(e);
        r->n_stop++;
    }
    return 0;
}

static int parse_stream_options(const kv_json *v, srv_gen_req *r, srv_error *e) {
    if (is_null(v)) return 0;
    if (kv_json_type_of(v) != KV_JSON_OBJECT) return wrong_type(e, "stream_options", "an object", v);
    for (size_t k = 0; k < kv_json_len(v); k++) {
        const char *key = kv_json_key_at(v, k, NULL);
        const kv_json *x = kv_json_at(v, k);
        int b;
        char p[96];
        snprintf(p, sizeof p, "stream_options.%s", key);
        if (!strcmp(key, "include_usage")) {
            if (!is_null(x) && get_bool(x, p, &r->include_usage, e)) return -1;
        } else if (!strcmp(key, "continuous_usage_stats")) {
            if (!is_null(x) && get_bool(x, p, &b, e)) return -1;
        } else {
            return BAD(e, p, "unknown_field", "unrecognized field '%s'", p);
        }
    }
    return 0;
}

/* Fields that take a feature kvtop does not have: accepted only at their
 * "off" value (null, false, 0, empty), otherwise a 400 saying so. */
static int unsupported_unless_off(const kv_json *v, const char *param, const char *what, srv_error *e) {
    kv_json_type t = kv_json_type_of(v);
    int off = t == KV_JSON_NULL || (t == KV_JSON_BOOL && !kv_json_bool(v)) ||
              (t == KV_JSON_NUMBER && kv_json_number(v) == 0) ||
              ((t == KV_JSON_ARRAY || t == KV_JSON_OBJECT) && kv_json_len(v) == 0) ||
              (t == KV_JSON_STRING && kv_json_str(v, NULL)[0] == 0);
    if (off) return 0;
    return BAD(e, param, "unsupported", "'%s' is not supported: %s", param, what);
}

/* One member of a generation request; returns 1 when the key is not one
 * of the common fields (the caller tries its own), 0 or -1. */
static int common_field(const char *key, const kv_json *v, srv_gen_req *r, srv_error *e) {
    /* float sampling members: the request's name, the profile key whose
     * range applies, the member */
    static const struct {
        const char *key, *cfg_key;
        size_t off;
    } floats[] = {
        {"temperature", "sampling.temperature", offsetof(kv_sampling, temperature)},
        {"top_p", "sampling.top_p", offsetof(kv_sampling, top_p)},
        {"min_p", "sampling.min_p", offsetof(kv_sampling, min_p)},
        {"repetition_penalty", "sampling.repeat_penalty", offsetof(kv_sampling, repeat_penalty)},
    };
    double d;
    long long x;
    const char *s;
    for (size_t i = 0; i < KV_ARRAY_LEN(floats); i++) {
        if (strcmp(key, floats[i].key)) continue;
        if (is_null(v)) return 0;
        if (key_num(v, key, floats[i].cfg_key, &d, e)) return -1;
        *(float *)((char *)&r->sampling + floats[i].off) = (float)d;
        return 0;
    }
    if (!strcmp(key, "model")) {
        if (is_null(v)) return 0;
        if (get_str(v, "model", sizeof r->model - 1, &s, NULL, e)) return -1;
        kv_copy_str(r->model, sizeof r->model, s);
    } else if (!strcmp(key, "max_tokens") || !strcmp(key, "max_completion_tokens")) {
        if (is_null(v)) return 0;
        if (get_int(v, key, 1, SRV_MAX_TOKENS_CAP, &x, e)) return -1;
        r->max_tokens = (int)x;
    } else if (!strcmp(key, "top_k")) {
        if (is_null(v)) return 0;
        /* vLLM's -1 means off, as kvtop's 0 does */
        if (kv_json_type_of(v) == KV_JSON_NUMBER && kv_json_number(v) == -1) {
            r->sampling.top_k = 0;
            return 0;
        }
        if (key_num(v, key, "sampling.top_k", &d, e)) return -1;
        r->sampling.top_k = (int)d;
    } else if (!strcmp(key, "seed")) {
        if (is_null(v)) return 0;
        /* integers a double holds exactly, as JSON clients send them */
        if (get_int(v, key, 0, 9007199254740992.0, &x, e)) return -1;
        r->sampling.seed = (uint64_t)x;
        r->has_seed = 1;
    } else if (!strcmp(key, "stop")) {
        return parse_stop(v, r, e);
    } else if (!strcmp(key, "stream")) {
        if (!is_null(v) && get_bool(v, key, &r->stream, e)) return -1;
    } else if (!strcmp(key, "stream_options")) {
        return parse_stream_options(v, r, e);
    } else if (!strcmp(key, "n")) {
        if (is_null(v)) return 0;
        if (get_int(v, key, 1, SRV_MAX_N, &x, e)) return -1;
        r->n = (int)x;
    } else if (!strcmp(key, "priority")) {
        if (is_null(v)) return 0;
        if (get_int(v, key, -1000000, 1000000, &x, e)) return -1;
        r->priority = (int)x;
    } else if (!strcmp(key, "ignore_eos")) {
        if (!is_null(v) && get_bool(v, key, &r->ignore_eos, e)) return -1;
    } else if (!strcmp(key, "return_tokens_as_token_ids")) {
        if (!is_null(v) && get_bool(v, key, &r->tokens_as_ids, e)) return -1;
    } else if (!strcmp(key, "parse_special")) {
        if (!is_null(v) && get_bool(v, key, &r->parse_special, e)) return -1;
    } else if (!strcmp(key, "user")) {
        if (!is_null(v) && get_str(v, key, 1024, &s, NULL, e)) return -1;
    } else if (!strcmp(key, "presence_penalty") || !strcmp(key, "frequency_penalty")) {
        if (!is_null(v) && kv_json_type_of(v) != KV_JSON_NUMBER) return wrong_type(e, key, "a number", v);
        return unsupported_unless_off(v, key, "kvtop's sampler has repetition_penalty only", e);
    } else if (!strcmp(key, "logit_bias")) {
        return unsupported_unless_off(v, key, "kvtop's sampler takes no logit bias", e);
    } else {
        return 1;
    }
    return 0;
}

static int chat_field(const char *key, const kv_json *v, srv_gen_req *r, srv_error *e) {
    if (!strcmp(key, "messages")) return parse_messages(v, &r->msgs, &r->n_msgs, e);
    if (!strcmp(key, "logprobs")) return is_null(v) ? 0 : get_bool(v, key, &r->logprobs, e);
    if (!strcmp(key, "top_logprobs")) {
        long long x;
        if (is_null(v)) return 0;
        if (get_int(v, key, 0, SRV_MAX_LOGPROBS, &x, e)) return -1;
        r->top_logprobs = (int)x;
        return 0;
    }
    if (!strcmp(key, "tools") || !strcmp(key, "functions") || !strcmp(key, "tool_choice") ||
        !strcmp(key, "function_call"))
        return unsupported_unless_off(v, key, "tool calls are not supported", e);
    if (!strcmp(key, "parallel_tool_calls")) {
        int b;
        return is_null(v) ? 0 : get_bool(v, key, &b, e);
    }
    if (!strcmp(key, "response_format")) {
        if (is_null(v)) return 0;
        const kv_json *t = kv_json_get(v, "type");
        if (kv_json_type_of(v) == KV_JSON_OBJECT && kv_json_len(v) == 1 && t &&
            kv_json_type_of(t) == KV_JSON_STRING && !strcmp(kv_json_str(t, NULL), "text"))
            return 0;
        return BAD(e, key, "unsupported", "'response_format' is not supported: only {\"type\": \"text\"}");
    }
    return 1;
}

static int completion_field(const char *key, const kv_json *v, srv_gen_req *r, srv_error *e) {
    if (!strcmp(key, "prompt")) return parse_prompts(v, r, e);
    if (!strcmp(key, "echo")) return is_null(v) ? 0 : get_bool(v, key, &r->echo, e);
    if (!strcmp(key, "logprobs")) { /* the number of alternatives; 0 = the chosen token's only */
        long long x;
        if (is_null(v)) return 0;
        if (get_int(v, key, 0, SRV_MAX_LOGPROBS, &x, e)) return -1;
        r->logprobs = 1;
        r->top_logprobs = (int)x;
        return 0;
    }
    if (!strcmp(key, "suffix")) return unsupported_unless_off(v, key, "no fill-in-the-middle", e);
    if (!strcmp(key, "best_of")) {
        long long x;
        if (is_null(v)) return 0;
        if (get_int(v, key, 1, SRV_MAX_N, &x, e)) return -1;
        if (x != 1) return BAD(e, key, "unsupported", "'best_of' other than 1 is not supported (use n)");
        return 0;
    }
    return 1;
}

int srv_parse_gen(const char *body, size_t len, srv_kind kind, const kv_sampling *sampling, srv_gen_req *out,
                  srv_error *e) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->max_tokens = -1;
    out->n = 1;
    if (sampling) out->sampling = *sampling;
    kv_json *root;
    if (parse_doc(body, len, &root, e)) return -1;
    int rc = 0;
    for (size_t i = 0; i < kv_json_len(root) && rc == 0; i++) {
        const char *key = kv_json_key_at(root, i, NULL);
        const kv_json *v = kv_json_at(root, i);
        rc = common_field(key, v, out, e);
        if (rc == 1) rc = kind == SRV_CHAT ? chat_field(key, v, out, e) : completion_field(key, v, out, e);
        if (rc == 1) rc = BAD(e, key, "unknown_field", "unrecognized field '%s'", key);
    }
    if (rc == 0 && kind == SRV_CHAT && !out->msgs) rc = BAD(e, "messages", "missing_field", "'messages' is required");
    if (rc == 0 && kind == SRV_COMPLETION && !out->prompts) rc = BAD(e, "prompt", "missing_field", "'prompt' is required");
    if (rc == 0 && !out->stream && out->include_usage)
        rc = BAD(e, "stream_options", "invalid_value", "'stream_options' needs \"stream\": true");
    int prompts = kind == SRV_COMPLETION ? out->n_prompts : 1;
    if (rc == 0 && prompts * out->n > SRV_MAX_CHOICES)
        rc = BAD(e, "n", "invalid_value", "%d prompts x n %d is more than %d choices", prompts, out->n, SRV_MAX_CHOICES);
    if (rc == 0 && kind == SRV_CHAT && out->top_logprobs > 0 && !out->logprobs)
        rc = BAD(e, "top_logprobs", "invalid_value", "'top_logprobs' needs \"logprobs\": true");
    if (rc == 0 && out->echo && out->logprobs)
        rc = BAD(e, "logprobs", "unsupported", "'logprobs' with 'echo' is not supported: no prompt logprobs");
    if (rc == 0 && out->echo && out->stream)
        rc = BAD(e, "echo", "unsupported", "'echo' with \"stream\": true is not supported");
    kv_json_free(root);
    if (rc) srv_gen_req_free(out);
    return rc ? -1 : 0;
}

static void free_msgs(srv_msg *m, int n) {
    for (int i = 0; m && i < n; i++) free(m[i].content);
    free(m);
}

void srv_gen_req_free(srv_gen_req *r) {
    if (!r) return;
    /* a message is counted before its content is parsed, so a failed parse
     * leaves nothing allocated uncounted */
    free_msgs(r->msgs, r->n_msgs);
    for (int i = 0; r->prompts && i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    for (int i = 0; r->stop && i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    memset(r, 0, sizeof *r);
}

/* ---- tokenize, detokenize, control ---- */

int srv_parse_tokenize(const char *body, size_t len, srv_tok_req *out, srv_error *e) {
    memset(out, 0, sizeof *out);
    out->add_special = 1;
    out->add_generation_prompt = 1;
    kv_json *root;
    if (parse_doc(body, len, &root, e)) return -1;
    int rc = 0;
    for (size_t i = 0; i < kv_json_len(root) && rc == 0; i++) {
        const char *key = kv_json_key_at(root, i, NULL), *s;
        const kv_json *v = kv_json_at(root, i);
        size_t l;
        if (!strcmp(key, "model")) {
            if (!is_null(v) && (rc = get_str(v, key, sizeof out->model - 1, &s, NULL, e)) == 0)
                kv_copy_str(out->model, sizeof out->model, s);
        } else if (!strcmp(key, "prompt")) {
            if ((rc = get_str(v, key, SIZE_MAX, &s, &l, e)) == 0) {
                free(out->prompt);
                if (!(out->prompt = dup_n(s, l))) rc = nomem(e);
                out->len = l;
            }
        } else if (!strcmp(key, "messages")) {
            rc = parse_messages(v, &out->msgs, &out->n_msgs, e);
        } else if (!strcmp(key, "add_generation_prompt")) {
            rc = get_bool(v, key, &out->add_generation_prompt, e);
        } else if (!strcmp(key, "add_special_tokens")) {
            rc = get_bool(v, key, &out->add_special, e);
        } else if (!strcmp(key, "parse_special")) {
            rc = get_bool(v, key, &out->parse_special, e);
        } else {
            rc = BAD(e, key, "unknown_field", "unrecognized field '%s'", key);
        }
    }
    if (rc == 0 && !out->prompt == !out->msgs)
        rc = BAD(e, "prompt", "missing_field", "exactly one of 'prompt' and 'messages' is required");
    kv_json_free(root);
    if (rc) srv_tok_req_free(out);
    return rc ? -1 : 0;
}

void srv_tok_req_free(srv_tok_req *r) {
    if (!r) return;
    free(r->prompt);
    free_msgs(r->msgs, r->n_msgs);
    memset(r, 0, sizeof *r);
}

int srv_parse_detokenize(const char *body, size_t len, srv_detok_req *out, srv_error *e) {
    memset(out, 0, sizeof *out);
    kv_json *root;
    if (parse_doc(body, len, &root, e)) return -1;
    int rc = 0, seen = 0;
    for (size_t i = 0; i < kv_json_len(root) && rc == 0; i++) {
        const char *key = kv_json_key_at(root, i, NULL), *s;
        const kv_json *v = kv_json_at(root, i);
        if (!strcmp(key, "model")) {
            if (!is_null(v) && (rc = get_str(v, key, sizeof out->model - 1, &s, NULL, e)) == 0)
                kv_copy_str(out->model, sizeof out->model, s);
        } else if (!strcmp(key, "tokens")) {
            seen = 1;
            if (kv_json_type_of(v) != KV_JSON_ARRAY) rc = wrong_type(e, key, "an array of token ids", v);
            else if (kv_json_len(v) > 0) rc = parse_ids(v, "tokens", &out->ids, &out->n_ids, e);
        } else {
            rc = BAD(e, key, "unknown_field", "unrecognized field '%s'", key);
        }
    }
    if (rc == 0 && !seen) rc = BAD(e, "tokens", "missing_field", "'tokens' is required");
    kv_json_free(root);
    if (rc) srv_detok_req_free(out);
    return rc ? -1 : 0;
}

void srv_detok_req_free(srv_detok_req *r) {
    if (!r) return;
    free(r->ids);
    memset(r, 0, sizeof *r);
}

int srv_parse_control(const char *body, size_t len, srv_ctl_req *out, srv_error *e) {
    memset(out, 0, sizeof *out);
    out->delay_ms = -1;
    kv_json *root;
    if (parse_doc(body, len, &root, e)) return -1;
    int rc = 0, have = 0;
    for (size_t i = 0; i < kv_json_len(root) && rc == 0; i++) {
        const char *key = kv_json_key_at(root, i, NULL), *s;
        const kv_json *v = kv_json_at(root, i);
        double d;
        if (!strcmp(key, "action")) {
            if ((rc = get_str(v, key, 32, &s, NULL, e))) break;
            have = 1;
            if (!strcmp(s, "pause")) out->action = SRV_CTL_PAUSE;
            else if (!strcmp(s, "resume")) out->action = SRV_CTL_RESUME;
            else if (!strcmp(s, "step")) out->action = SRV_CTL_STEP;
            else if (!strcmp(s, "slow")) out->action = SRV_CTL_SLOW;
            else rc = BAD(e, key, "invalid_value", "'action' must be pause, resume, step or slow, got '%s'", s);
        } else if (!strcmp(key, "delay_ms")) {
            if ((rc = key_num(v, key, "ui.step_delay_ms", &d, e)) == 0) out->delay_ms = (int)d;
        } else {
            rc = BAD(e, key, "unknown_field", "unrecognized field '%s'", key);
        }
    }
    if (rc == 0 && !have) rc = BAD(e, "action", "missing_field", "'action' is required");
    if (rc == 0 && out->action == SRV_CTL_SLOW && out->delay_ms < 0)
        rc = BAD(e, "delay_ms", "missing_field", "'delay_ms' is required for \"slow\"");
    kv_json_free(root);
    return rc ? -1 : 0;
}
