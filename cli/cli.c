/* cli.c - option parsing helpers for the subcommands. */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/file.h"
#include "../base/fmt.h"

int cli_str(int argc, char **argv, int *i, const char **out) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "kvtop %s: option %s needs a value\n", argv[0], argv[*i]);
        return -1;
    }
    *out = argv[++*i];
    return 0;
}

int cli_int(int argc, char **argv, int *i, long lo, long hi, int *out) {
    const char *s;
    if (cli_str(argc, argv, i, &s)) return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "kvtop %s: %s '%s' is not an integer in [%ld, %ld]\n", argv[0], argv[*i - 1], s, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int cli_u64(int argc, char **argv, int *i, uint64_t *out) {
    const char *s;
    if (cli_str(argc, argv, i, &s)) return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') {
        fprintf(stderr, "kvtop %s: %s '%s' is not a non-negative integer\n", argv[0], argv[*i - 1], s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_float(int argc, char **argv, int *i, double lo, double hi, float *out) {
    const char *s;
    if (cli_str(argc, argv, i, &s)) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "kvtop %s: %s '%s' is not a number in [%g, %g]\n", argv[0], argv[*i - 1], s, lo, hi);
        return -1;
    }
    *out = (float)v;
    return 0;
}

char *cli_read_file(const char *path, size_t *len) {
    char *buf;
    return kv_read_file(path, 0, &buf, len, NULL) == 0 ? buf : NULL;
}

char *cli_read_prompt(const char *path, size_t *len, kv_err *err) {
    char *buf;
    size_t n;
    if (kv_read_file(path, 0, &buf, &n, err)) return NULL;
    const char *nul = memchr(buf, 0, n);
    if (nul) {
        kv_err_set(err, KV_ERR_FORMAT, "%s: byte %zu is a NUL; a prompt file must be text (%zu bytes)", path,
                   (size_t)(nul - buf), n);
        free(buf);
        return NULL;
    }
    if (len) *len = n;
    return buf;
}

const char *cli_bytes(uint64_t n, char *buf, size_t cap) {
    kv_format_bytes(buf, cap, n);
    return buf;
}

/* ---- the option parser ---- */

static const cli_opt *find_opt(const cli_spec *s, const char *a, size_t len) {
    for (int i = 0; i < s->n_opts; i++) {
        const cli_opt *o = &s->opts[i];
        if ((strlen(o->name) == len && !strncmp(o->name, a, len)) ||
            (o->alias && strlen(o->alias) == len && !strncmp(o->alias, a, len)))
            return o;
    }
    return NULL;
}

int cli_list_add(cli_list *l, const char *v) {
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 8;
        const char **p = realloc(l->v, (size_t)nc * sizeof *p);
        if (!p) return KV_ERR_NOMEM;
        l->v = p;
        l->cap = nc;
    }
    l->v[l->n++] = v;
    return 0;
}

/* Stores value v of option o (named `shown` on the command line). */
static int apply_opt(const cli_spec *s, const cli_opt *o, const char *shown, const char *v) {
    switch (o->kind) {
    case CLI_FLAG: *(int *)o->dst = 1; return 0;
    case CLI_STR: *(const char **)o->dst = v; return 0;
    case CLI_LIST:
        if (cli_list_add(o->dst, v)) {
            fprintf(stderr, "kvtop %s: out of memory\n", s->cmd);
            return KV_ERR_NOMEM;
        }
        return 0;
    case CLI_INT: {
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (errno || end == v || *end || x < o->lo || x > o->hi) {
            fprintf(stderr, "kvtop %s: %s '%s' is not an integer in [%ld, %ld]\n", s->cmd, shown, v, o->lo, o->hi);
            return KV_ERR_INVAL;
        }
        *(int *)o->dst = (int)x;
        return 0;
    }
    case CLI_KEY: {
        const kv_config_key *k = kv_config_key_find(o->key);
        kv_err err;
        kv_err_clear(&err);
        if (!k || !s->cfg) {
            fprintf(stderr, "kvtop %s: %s: no profile key %s\n", s->cmd, shown, o->key);
            return KV_ERR_INVAL;
        }
        if (kv_config_key_parse(k, s->cfg, v, &err)) {
            fprintf(stderr, "kvtop %s: %s: %s\n", s->cmd, shown, err.msg);
            return KV_ERR_INVAL;
        }
        return 0;
    }
    }
    return KV_ERR_INVAL;
}

int cli_parse(const cli_spec *s, int argc, char **argv) {
    if (s->n_pos) *s->n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (s->usage) s->usage(stdout);
            return CLI_HELP;
        }
        if (a[0] != '-' || !a[1]) { /* a positional argument ("-" included) */
            if (!s->n_pos || *s->n_pos >= s->max_pos) {
                fprintf(stderr, "kvtop %s: unexpected argument '%s'\n", s->cmd, a);
                return KV_ERR_INVAL;
            }
            s->pos[(*s->n_pos)++] = a;
            continue;
        }
        const char *eq = !strncmp(a, "--", 2) ? strchr(a, '=') : NULL;
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const cli_opt *o = find_opt(s, a, len);
        if (!o || (eq && o->kind == CLI_FLAG)) {
            fprintf(stderr, "kvtop %s: unknown option '%s'\n", s->cmd, a);
            if (s->usage) s->usage(stderr);
            return KV_ERR_INVAL;
        }
        const char *v = NULL;
        if (o->kind != CLI_FLAG) {
            if (eq) {
                v = eq + 1;
            } else if (i + 1 < argc) {
                v = argv[++i];
            } else {
                fprintf(stderr, "kvtop %s: option %s needs a value\n", s->cmd, a);
                return KV_ERR_INVAL;
            }
        }
        char shown[64];
        snprintf(shown, sizeof shown, "%.*s", (int)KV_MIN(len, sizeof shown - 1), a);
        int rc = apply_opt(s, o, shown, v);
        if (rc) return rc;
    }
    return CLI_OK;
}

int cli_parse_exit(int rc) { return rc == CLI_HELP ? 0 : 2; }

void cli_list_free(cli_list *l) {
    if (!l) return;
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}
