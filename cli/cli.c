/* cli.c - option parsing helpers for the subcommands. */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

const char *cli_bytes(uint64_t n, char *buf, size_t cap) {
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%llu B", (unsigned long long)n);
    else
        snprintf(buf, cap, "%.2f %s", v, units[u]);
    return buf;
}
