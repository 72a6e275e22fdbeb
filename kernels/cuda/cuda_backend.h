/* cuda_backend.h - the "cuda" backend (built with make CUDA=1): device
 * buffers, weights copied to the device in their GGUF block layout, and one
 * CUDA kernel per op of backend.h, each in three layers (__global__ kernel
 * -> launcher taking a stream -> the table's op).
 *
 * A failing CUDA call or launch is recorded on the backend under its op's
 * name (the first one since the last ops.status is kept), outputs of a
 * failed op are NaN where that can be arranged, and ops.status (backend.h)
 * hands the record to the forward pass after each batch, which fails that
 * batch with KV_ERR_BACKEND. Nothing aborts and nothing is printed. The
 * quantized matmul's activations and the id / position staging are sized
 * by ops.reserve; an op asked for more fails instead of allocating. */
#ifndef KV_CUDA_BACKEND_H
#define KV_CUDA_BACKEND_H

#ifdef __cplusplus
extern "C" {
#endif

#include "../backend.h" /* (C headers: C linkage from C++ too) */

/* Creates the backend on device KVTOP_CUDA_DEVICE (default 0); n_threads is
 * unused. KVTOP_CUDA_SYNC=1 waits after every op, so that a kernel failing
 * at run time is reported under its op's name (slower; for debugging). Returns NULL with err filled (KV_ERR_UNSUPPORTED) when no CUDA
 * device or driver is present. Freed by kv_backend_free. */
kv_backend *kv_cuda_backend_create(int n_threads, kv_err *err);

/* Number of CUDA devices the runtime sees; 0 when none or no driver. */
int kv_cuda_device_count(void);

/* The first error recorded since the last call (copied into err when not
 * NULL, "cuda backend: <op>: <message>"), then forgets it. Returns its
 * code, 0 when none. Waits for the work queued so far, so errors of running
 * kernels are seen too. ops.status is the same record with KV_ERR_BACKEND. */
int kv_cuda_last_error(kv_backend *b, kv_err *err);

/* NOTE: weights and RMSNorm vectors that arrive as host pointers (the model
 * mapping) are copied to the device on first use and cached by host
 * address. Call this when host memory that was used that way is freed or
 * rewritten without upload_weight (another model loaded into the same
 * backend), so stale copies are not used. upload_weight always refreshes
 * its tensor's copy. */
void kv_cuda_forget_host_copies(kv_backend *b);

#ifdef __cplusplus
}
#endif

#endif
