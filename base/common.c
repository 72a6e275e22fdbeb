/* common.c - error reporting, clocks and a median. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int kv_err_set(kv_err *err, int code, const char *fmt, ...) {
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

void kv_err_clear(kv_err *err) {
    if (!err) return;
    err->code = 0;
    err->msg[0] = '\0';
}

const char *kv_err_str(int code) {
    switch (code) {
    case KV_OK: return "ok";
    case KV_ERR_INVAL: return "invalid argument";
    case KV_ERR_NOMEM: return "out of memory";
    case KV_ERR_IO: return "I/O error";
    case KV_ERR_FORMAT: return "malformed input";
    case KV_ERR_BACKEND: return "backend failure";
    case KV_ERR_UNSUPPORTED: return "unsupported";
    case KV_ERR_RANGE: return "out of range";
    case KV_AGAIN: return "try again";
    default: return "unknown error";
    }
}

void kv_copy_str(char *dst, size_t cap, const char *src) {
    if (cap == 0) return;
    size_t n = src ? strnlen(src, cap - 1) : 0;
    if (n) memcpy(dst, src, n);
    dst[n] = 0;
}

uint64_t kv_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double kv_now_s(void) { return (double)kv_now_ns() * 1e-9; }

double kv_cpu_time_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kv_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
