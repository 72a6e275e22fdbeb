/* common.h - error codes, the error struct every module reports into, and
 * small helpers (time, checked arithmetic) shared by engine/ and kernels/.
 * Nothing here allocates. */
#ifndef KV_COMMON_H
#define KV_COMMON_H

#include <stddef.h>
#include <stdint.h>

/* Return codes: 0 is success, negative is an error, positive is "not now". */
enum {
    KV_OK = 0,
    KV_ERR_INVAL = -1,       /* bad argument or bad input from outside */
    KV_ERR_NOMEM = -2,       /* allocation failed or budget exhausted */
    KV_ERR_IO = -3,          /* open/read/write/mmap failed */
    KV_ERR_FORMAT = -4,      /* malformed file contents */
    KV_ERR_BACKEND = -5,     /* backend (CPU/CUDA/sim) failure */
    KV_ERR_UNSUPPORTED = -6, /* valid input we do not support (arch, type) */
    KV_ERR_RANGE = -7,       /* value out of range (token id, context) */
    KV_AGAIN = 1             /* not now, try later */
};

/* An error report: the code plus a message naming what was wrong (file,
 * tensor, key, line:column). Callers may pass NULL when they do not care.
 * A `kv_err *err` parameter is always an output; headers mark the other
 * output parameters with OUT comments. */
typedef struct kv_err {
    int code;        /* one of the KV_ERR_* values, 0 when no error */
    char msg[512];   /* NUL-terminated human-readable message */
} kv_err;

/* Sets err->code and formats err->msg (no-op when err is NULL).
 * Returns code, so callers can write `return kv_err_set(err, ...)`. */
int kv_err_set(kv_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Clears an error struct (no-op when err is NULL). */
void kv_err_clear(kv_err *err);
/* Static string for a code ("invalid argument", ...). */
const char *kv_err_str(int code);

/* Copies the NUL-terminated src into dst, truncated to cap - 1 bytes and
 * always terminated; NULL src copies "", cap 0 writes nothing. NOTE: a cut
 * may fall inside a UTF-8 character; callers that show the text cut it
 * themselves first (kv_utf8_boundary). */
void kv_copy_str(char *dst /* OUT: (cap) */, size_t cap, const char *src);

/* Monotonic clock in nanoseconds / seconds. */
uint64_t kv_now_ns(void);
double kv_now_s(void);
/* The process's CPU time (all threads) in seconds. */
double kv_cpu_time_s(void);

/* The median of v[0..n) (n >= 1), sorting v in place. */
double kv_median(double *v, int n);

/* Overflow-checked arithmetic: return 0 on success, -1 on overflow. */
static inline int kv_add_overflow(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}
static inline int kv_mul_overflow(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}

#define KV_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KV_MAX(a, b) ((a) > (b) ? (a) : (b))
#define KV_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
