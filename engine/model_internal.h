/* model_internal.h - what model.c (the GGUF and llama2.c readers) and
 * arch.c (what each architecture adds: its keys and tensors) share inside
 * the engine: the helpers that bind a named tensor or read a key with the
 * checks and error messages every loader gives. */
#ifndef KV_MODEL_INTERNAL_H
#define KV_MODEL_INTERNAL_H

#include "model.h"

/* Reads the unsigned key "<arch>.<suffix>" into *out (OUT), def when absent;
 * a required key must be present. 0, or KV_ERR_FORMAT with err naming the
 * key (missing, or above INT32_MAX / 4). */
int kv_model_hp_u32(const kv_gguf *g, const char *arch, const char *suffix, int required, uint32_t def, int *out,
                    const char *path, kv_err *err);
/* Reads the float key "<arch>.<suffix>" into *out (OUT), unchanged when
 * absent. 0, or an error naming the key (wrong type). */
int kv_model_hp_f32(const kv_gguf *g, const char *arch, const char *suffix, float *out, kv_err *err);

/* Binds the 2-D weight `name` of exactly (ne0, ne1) in a type the kernels
 * compute with into *out (OUT). 0; 1 when it is absent and optional;
 * else KV_ERR_FORMAT / KV_ERR_UNSUPPORTED with err naming the tensor and
 * what was expected. Counts it in the model's totals. */
int kv_model_bind_matrix(kv_model *m, const char *name, int64_t ne0, int64_t ne1, int optional, kv_tensor *out,
                         kv_err *err);
/* The part of kv_model_bind_matrix after the shape check: t read as ne1
 * rows of ne0 (a 3-D tensor's rows over all its planes), in a type the
 * kernels compute with, into *out (OUT), counted in the totals. 0 or
 * KV_ERR_UNSUPPORTED naming the tensor. */
int kv_model_bind_tensor_rows(kv_model *m, const kv_gguf_tensor *t, int64_t ne0, int64_t ne1, kv_tensor *out,
                              kv_err *err);
/* Binds the vector `name` of exactly n elements as f32 (converted into an
 * owned copy when stored otherwise) into *out (OUT). 0; 1 when absent and
 * optional; else an error naming the tensor. */
int kv_model_bind_vector(kv_model *m, const char *name, int64_t n, int optional, const float **out, kv_err *err);

/* The architecture named s (general.architecture), or -1. */
int kv_arch_find(kv_gguf_str s);
/* Sets the per-architecture defaults of m->hp (act, RoPE layout, scales)
 * for hp.arch_id before any key is read. */
void kv_arch_defaults(kv_hparams *hp);
/* Reads what the architecture adds to the common keys (sliding window,
 * RoPE scaling, query scale) and checks it against them: a window larger
 * than the context, an unknown RoPE scaling type are refused naming the
 * key. 0 or an error. */
int kv_arch_load_hparams(kv_model *m, kv_err *err);
/* Binds every layer's tensors (the architecture's names and shapes: fused
 * QKV views, biases, Q/K and post norms), the final norm and the output
 * head. 0 or an error naming the tensor. */
int kv_arch_bind_tensors(kv_model *m, kv_err *err);

/* Mixture of experts (arch_moe.c). Reads expert_count, expert_used_count
 * and expert_feed_forward_length (qwen3moe: required; llama: an
 * expert_count makes it Mixtral-style) and checks them (count in [1,
 * KV_MOE_MAX_EXPERTS], used in [1, count]), naming the key. 0 or an error. */
int kv_arch_moe_load_hparams(kv_model *m, kv_err *err);
/* Binds layer l's router and expert tensors (3-D, checked against
 * [dim, expert_ffn, n_expert] / [expert_ffn, dim, n_expert]) as per-expert
 * views. 0 or an error naming the tensor. */
int kv_arch_moe_bind(kv_model *m, int l, kv_layer *L, kv_err *err);
/* Writes what `kvtop info` shows of the experts into buf (cap); returns
 * the length written ("" and 0 for a dense model). */
size_t kv_arch_moe_describe(const kv_model *m, char *buf, size_t cap);

#endif
