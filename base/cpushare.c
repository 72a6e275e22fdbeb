/* cpushare.c - this process's cores split among engines (cpushare.h). */
#include "cpushare.h"

#include <stdio.h>

int kv_cpus_allowed(int *ids, int cap) {
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        for (int i = 0; i < CPU_SETSIZE && n < cap; i++)
            if (CPU_ISSET(i, &set)) ids[n++] = i;
    if (n == 0 && cap > 0) ids[n++] = 0;
    return n;
}

int kv_cpu_share(const int *ids, int n_ids, int j, int n, cpu_set_t *set, char *label, size_t label_cap) {
    CPU_ZERO(set);
    int lo, cnt;
    if (n_ids >= n) {
        lo = j * n_ids / n;
        cnt = (j + 1) * n_ids / n - lo;
    } else {
        lo = j % n_ids;
        cnt = 1;
    }
    for (int i = 0; i < cnt; i++) CPU_SET(ids[lo + i], set);
    if (cnt == 1) snprintf(label, label_cap, "cpu %d", ids[lo]);
    else snprintf(label, label_cap, "cpu %d-%d", ids[lo], ids[lo + cnt - 1]);
    return cnt;
}
