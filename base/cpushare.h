/* cpushare.h - splitting this process's cores among engines that run at
 * once (the TUI's --compare columns, `kvtop bench --compare --concurrent`):
 * the same split in both, so their figures can be set side by side. */
#ifndef KV_CPUSHARE_H
#define KV_CPUSHARE_H

#include <sched.h>
#include <stddef.h>

/* The cores this process may run on, in order: their ids into ids[] (cap
 * of them at most), the count returned (at least 1: cpu 0 when the mask
 * cannot be read). */
int kv_cpus_allowed(int *ids, int cap);
/* Engine j of n's share of ids[0..n_ids): a contiguous slice when there
 * are at least as many cores as engines, else one core, round robin. Fills
 * *set, and label ("cpu 3", "cpu 0-3"); returns the number of cores in it. */
int kv_cpu_share(const int *ids, int n_ids, int j, int n, cpu_set_t *set /* OUT: */, char *label /* OUT: */,
                 size_t label_cap);

#endif
