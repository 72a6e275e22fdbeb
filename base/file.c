/* file.c - reading a whole file, and telling two paths of one file apart
 * (see file.h). */
#include "file.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int kv_read_file(const char *path, size_t max_bytes, char **out, size_t *len, kv_err *err) {
    *out = NULL;
    if (len) *len = 0;
    if (!path) return kv_err_set(err, KV_ERR_INVAL, "read file: NULL path");
    FILE *f = fopen(path, "rb");
    if (!f) return kv_err_set(err, KV_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t limit = max_bytes ? max_bytes : SIZE_MAX - 1;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (n + 1 >= cap) { /* room for one more byte and the NUL */
            size_t nc = cap ? cap * 2 : 4096;
            if (cap > SIZE_MAX / 2) nc = SIZE_MAX;
            char *nb = realloc(buf, nc);
            if (!nb) {
                rc = kv_err_set(err, KV_ERR_NOMEM, "%s: out of memory", path);
                goto fail;
            }
            buf = nb;
            cap = nc;
        }
        /* read at most one byte past the limit: enough to know it is over */
        size_t want = cap - n - 1;
        if (want > limit + 1 - n) want = limit + 1 - n;
        size_t got = fread(buf + n, 1, want, f);
        n += got;
        if (n > limit) {
            rc = kv_err_set(err, KV_ERR_FORMAT, "%s: larger than %zu bytes", path, limit);
            goto fail;
        }
        if (got == 0) break;
    }
    if (ferror(f)) {
        rc = kv_err_set(err, KV_ERR_IO, "%s: cannot read: %s", path, strerror(errno ? errno : EIO));
        goto fail;
    }
    fclose(f);
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return 0;
fail:
    free(buf);
    fclose(f);
    return rc;
}

int kv_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (!a || !b || stat(a, &sa) != 0 || stat(b, &sb) != 0) return 0;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}
