/* fmt.c - the shared number formatters (see fmt.h). */
#include "fmt.h"

#include <stdio.h>

int kv_format_bytes(char *buf, size_t cap, uint64_t bytes) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (!buf || cap == 0) return 0;
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    int n;
    if (u == 0) n = snprintf(buf, cap, "%llu B", (unsigned long long)bytes);
    else if (v < 10.0) n = snprintf(buf, cap, "%.2f %s", v, units[u]); /* like `ls -h`, one digit more */
    else if (v < 100.0) n = snprintf(buf, cap, "%.1f %s", v, units[u]);
    else n = snprintf(buf, cap, "%.0f %s", v, units[u]);
    if (n < 0) {
        buf[0] = 0;
        return 0;
    }
    return (size_t)n >= cap ? (int)cap - 1 : n;
}
