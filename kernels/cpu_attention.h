/* cpu_attention.h - the CPU paged-attention kernels: explicit-pool,
 * explicit-ISA entry points (the cpu backend's ops kv_cpu_kv_store /
 * kv_cpu_attention / kv_cpu_copy_block, declared in cpu.h, call them with
 * the backend's pool and ISA; tests and benchmarks call them directly), and
 * the batch validator the kernels rely on. They allocate nothing and read
 * no backend state. */
#ifndef KV_CPU_ATTENTION_H
#define KV_CPU_ATTENTION_H

#include "backend.h"
#include "cpu_isa.h"
#include "threadpool.h"

/* Largest head_dim the kernels take (larger: they do nothing). */
#define KV_ATTN_MAX_HEAD_DIM 4096

/* kv_cpu_attention on `pool` (NULL: the calling thread only) with the
 * kernels of `isa` (an ISA this CPU lacks falls back to scalar). */
void kv_attn_run(kv_threadpool *pool, kv_cpu_isa isa, const kv_pages *kv, int layer, const kv_attn_batch *ab,
                 const float *q, float *out, int n_heads, float scale);
/* kv_attn_run where a token at position p sees positions > p - window only
 * (sliding-window layers; window <= 0: all of 0..p). Blocks wholly before
 * a token group's window are not read. */
void kv_attn_run_window(kv_threadpool *pool, kv_cpu_isa isa, const kv_pages *kv, int layer, const kv_attn_batch *ab,
                        const float *q, float *out, int n_heads, float scale, int window);
/* kv_attn_run_window with `part` (part_floats floats, NULL: none) for
 * splitting long contexts across the pool's threads: when a batch has few
 * work items for the threads and a context longer than one chunk, each
 * item's context is cut into its chunks (fixed positions, independent of the
 * thread count and of the batch), taken by the threads, and their softmax
 * states merged after. The results are the same bits with or without part
 * (every path folds the same chunks in the same order); part only adds
 * parallelism. Needs kv_attn_split_floats floats, else runs unsplit.
 * Returns 1 when it split, 0 when not (the tests check both paths ran). */
int kv_attn_run_split(kv_threadpool *pool, kv_cpu_isa isa, const kv_pages *kv, int layer, const kv_attn_batch *ab,
                       const float *q, float *out, int n_heads, float scale, int window, float *part,
                       size_t part_floats);
/* Floats of part a split of n_tokens tokens with contexts up to max_context
 * needs (0 for bad arguments). */
size_t kv_attn_split_floats(const kv_pages *kv, int n_tokens, int n_heads, int max_context);
/* The integer int8 path on its own (the tests): nr query rows q (nr, hd)
 * quantized to int8 as the kernels do, scored against nt int8-cache rows
 * (stride bytes apart) into s (nr, nt) with the kernels of isa; scalar is
 * the path's reference. Returns 0, or -1 when isa scores int8 keys in
 * float (no integer path) or the arguments are out of range. */
/* 1 when the attention kernels of isa (as kv_attn_run picks them) score
 * int8 keys in integers against int8-quantized queries (AVX2: vpmaddubsw
 * on |k| and the query with k's sign; AVX-512: VNNI vpdpbusd): the
 * query's rounding then adds ~2e-3 normalised error to the output, next to
 * the ~4e-3 of the int8 cache itself. 0: in float. */
int kv_attn_int8_integer(kv_cpu_isa isa);
int kv_attn_scores_q8(kv_cpu_isa isa, const float *q, int nr, int hd, const uint8_t *rows, size_t stride, int nt,
                      float scale, float *s);
/* kv_cpu_kv_store on `pool` with the kernels of `isa`. */
void kv_attn_store(kv_threadpool *pool, kv_cpu_isa isa, kv_pages *kv, int layer, const kv_attn_batch *ab,
                   const float *k, const float *v);

/* Copies physical block src to dst in every layer of kv (K and V); out of
 * range or equal blocks do nothing. */
void kv_attn_copy_block(kv_pages *kv, int dst, int src);

/* Checks what the kernels assume and do not re-check in the hot path:
 * head_dim <= KV_ATTN_MAX_HEAD_DIM; n_heads a positive multiple of
 * kv->n_kv_heads; every token's sequence in
 * [0, n_seqs), position >= 0, slot in the pool and equal to the slot its
 * table gives for its position; every table entry up to its position in
 * [0, n_blocks). Returns 0, or KV_ERR_RANGE / KV_ERR_INVAL with err naming
 * the token. O(sum of context blocks). */
int kv_attn_batch_check(const kv_pages *kv, const kv_attn_batch *ab, int n_heads, kv_err *err);

#endif
