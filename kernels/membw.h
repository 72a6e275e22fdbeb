/* membw.h - measures the host's memory read bandwidth, the ceiling that a
 * single-stream decode (one pass over every weight per token) runs into.
 * Benchmarks print it next to the GB/s their kernels reach. */
#ifndef KV_MEMBW_H
#define KV_MEMBW_H

#include <stddef.h>

#include "threadpool.h"

/* Read bandwidth in GB/s (1e9 bytes/s): every thread of p (NULL: the calling
 * thread) sums its share of a `bytes`-long buffer (0: 256 MiB; pick it well
 * above the last-level cache), `reps` times (<= 0: 5); the median rep
 * counts. The buffer is allocated, touched and freed here. Returns a
 * negative value when memory cannot be had. */
double kv_membw_measure_gbs(kv_threadpool *p, size_t bytes, int reps);

#endif
