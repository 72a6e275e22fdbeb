/* gguf.h - GGUF v2/v3 reader (mmap, every metadata value type including
 * nested arrays, tensor infos, alignment; every offset, size and count checked
 * against the file size with overflow-safe arithmetic) and a writer.
 *
 * A malformed or truncated file is an error that says what is wrong; the
 * reader never reads outside the mapped bytes.
 *
 * What open accepts (everything else is KV_ERR_FORMAT, v1 / big-endian files
 * KV_ERR_UNSUPPORTED): keys and tensor names non-empty, without NUL bytes,
 * unique; bools 0 or 1; arrays nested at most 16 deep; general.alignment any
 * integer type holding a power of two (default 32); tensors with 1..4 dims,
 * every ne >= 1 (zero-size dims are rejected: no model has empty tensors),
 * ne[0] a multiple of the type's block size, a known kv_type, data offset a
 * multiple of the alignment and data inside the file.
 * NOTE: a little-endian host is assumed (values are read with memcpy). */
#ifndef KV_GGUF_H
#define KV_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "../base/common.h"
#include "../kernels/types.h"

/* Metadata value types, with GGUF's numbering. */
typedef enum kv_gguf_vtype {
    KV_GGUF_UINT8 = 0,
    KV_GGUF_INT8 = 1,
    KV_GGUF_UINT16 = 2,
    KV_GGUF_INT16 = 3,
    KV_GGUF_UINT32 = 4,
    KV_GGUF_INT32 = 5,
    KV_GGUF_FLOAT32 = 6,
    KV_GGUF_BOOL = 7,
    KV_GGUF_STRING = 8,
    KV_GGUF_ARRAY = 9,
    KV_GGUF_UINT64 = 10,
    KV_GGUF_INT64 = 11,
    KV_GGUF_FLOAT64 = 12
} kv_gguf_vtype;

/* A string inside the file: not NUL-terminated, points into the mapping. */
typedef struct kv_gguf_str {
    uint64_t len;
    const char *data;
} kv_gguf_str;

#define KV_GGUF_MAX_DIMS 4

typedef struct kv_gguf_tensor {
    kv_gguf_str name;             /* unique, non-empty, no NUL bytes */
    kv_type type;
    int n_dims;
    int64_t ne[KV_GGUF_MAX_DIMS]; /* ne[0] is the row length (contiguous), unused dims are 1 */
    uint64_t offset;              /* from the start of the data section */
    uint64_t size;                /* bytes */
    const void *data;             /* borrowed; points into the mapping */
} kv_gguf_tensor;

typedef struct kv_gguf kv_gguf; /* opaque */

/* Opens and validates a GGUF file (mmap, read-only). On error returns NULL
 * and fills err with what is wrong (file name, key, tensor, offset). */
kv_gguf *kv_gguf_open(const char *path, kv_err *err);
/* Same over a caller-owned buffer (fuzzing, tests); buf must outlive the
 * handle. */
kv_gguf *kv_gguf_open_mem(const void *buf, size_t size, kv_err *err);
void kv_gguf_close(kv_gguf *g); /* NULL is a no-op */

uint32_t kv_gguf_version(const kv_gguf *g);
uint64_t kv_gguf_alignment(const kv_gguf *g);
size_t kv_gguf_file_size(const kv_gguf *g);
/* Byte offset of the tensor data section in the file (aligned). */
size_t kv_gguf_data_offset(const kv_gguf *g);
/* The path given to kv_gguf_open, or "<memory>" (borrowed). */
const char *kv_gguf_name(const kv_gguf *g);
/* "u8", "i32", "string", "array", ...; "unknown" out of range. */
const char *kv_gguf_vtype_name(kv_gguf_vtype t);

/* --- metadata --- */
int64_t kv_gguf_n_kv(const kv_gguf *g);
/* Index of key, or -1. */
int64_t kv_gguf_find_key(const kv_gguf *g, const char *key);
/* Key i in file order ({0, NULL} out of range); its type
 * ((kv_gguf_vtype)-1 out of range). */
kv_gguf_str kv_gguf_key_at(const kv_gguf *g, int64_t i);
kv_gguf_vtype kv_gguf_type_at(const kv_gguf *g, int64_t i);

/* Typed getters by key. Each returns 0 and writes *out when the key exists
 * and holds a compatible value (any integer type for the integer getters
 * when the value fits; float32 or float64 for the float getters), 1 when the
 * key is absent (*out untouched), and KV_ERR_FORMAT (with err filled) when
 * the key exists with an incompatible type or out-of-range value. */
int kv_gguf_get_u64(const kv_gguf *g, const char *key, uint64_t *out, kv_err *err);
int kv_gguf_get_i64(const kv_gguf *g, const char *key, int64_t *out, kv_err *err);
int kv_gguf_get_u32(const kv_gguf *g, const char *key, uint32_t *out, kv_err *err);
int kv_gguf_get_f32(const kv_gguf *g, const char *key, float *out, kv_err *err);
int kv_gguf_get_bool(const kv_gguf *g, const char *key, int *out, kv_err *err);
int kv_gguf_get_str(const kv_gguf *g, const char *key, kv_gguf_str *out, kv_err *err);

/* Arrays: kv_gguf_get_arr returns 0 and the element type and count, 1 when
 * absent, KV_ERR_FORMAT when the key is not an array. For an array of arrays
 * elem_type is KV_GGUF_ARRAY. */
int kv_gguf_get_arr(const kv_gguf *g, const char *key, kv_gguf_vtype *elem_type,
                    uint64_t *n, kv_err *err);
/* Element i of an array of strings (validated at open, O(1) access);
 * {0, NULL} when absent, not a string array or i out of range. */
kv_gguf_str kv_gguf_arr_str(const kv_gguf *g, const char *key, uint64_t i);
/* Pointer to the raw little-endian elements of a numeric array (borrowed;
 * may be unaligned: read with memcpy), or NULL. */
const void *kv_gguf_arr_data(const kv_gguf *g, const char *key);
/* Element i of a numeric array (bools count as 0/1) converted to double /
 * int64 (0 when out of range or not numeric; floats truncate toward zero). */
double kv_gguf_arr_f64(const kv_gguf *g, const char *key, uint64_t i);
int64_t kv_gguf_arr_i64(const kv_gguf *g, const char *key, uint64_t i);

/* Human-readable rendering of value i (scalars in full, arrays as
 * "[type x N] first, elements, ..." truncated to cap bytes). */
void kv_gguf_format_value(const kv_gguf *g, int64_t i, char *buf, size_t cap);

/* --- tensors --- */
int64_t kv_gguf_n_tensors(const kv_gguf *g);
const kv_gguf_tensor *kv_gguf_tensor_at(const kv_gguf *g, int64_t i);
const kv_gguf_tensor *kv_gguf_find_tensor(const kv_gguf *g, const char *name);

/* Compares a kv_gguf_str to a C string. */
int kv_gguf_str_eq(kv_gguf_str s, const char *c);

/* --- writer --- *
 * Collects metadata and tensors in memory order, then writes a GGUF v3 file
 * with the given alignment (default 32). Tensor data is copied at add time
 * unless added with kv_gguf_writer_add_tensor_ref, which borrows it until
 * kv_gguf_writer_write returns, or with kv_gguf_writer_add_tensor_fn, whose
 * rows are produced at write time (so a model larger than memory streams).
 *
 * Every add checks its arguments (duplicate key / tensor names, bad types,
 * sizes) and returns 0 or a negative code, changing nothing on failure. The
 * first failure is also remembered: kv_gguf_writer_write then fails with its
 * message, so a caller may check only the final write.
 * general.alignment is managed by set_alignment (also settable as a uint32
 * key); it is written only when it differs from 32 or was given explicitly. */
typedef struct kv_gguf_writer kv_gguf_writer;

kv_gguf_writer *kv_gguf_writer_new(void);
void kv_gguf_writer_free(kv_gguf_writer *w);
int kv_gguf_writer_set_alignment(kv_gguf_writer *w, uint32_t alignment);
int kv_gguf_writer_add_u32(kv_gguf_writer *w, const char *key, uint32_t v);
int kv_gguf_writer_add_i32(kv_gguf_writer *w, const char *key, int32_t v);
int kv_gguf_writer_add_u64(kv_gguf_writer *w, const char *key, uint64_t v);
int kv_gguf_writer_add_f32(kv_gguf_writer *w, const char *key, float v);
int kv_gguf_writer_add_bool(kv_gguf_writer *w, const char *key, int v);
int kv_gguf_writer_add_str(kv_gguf_writer *w, const char *key, const char *v);
/* Any fixed-size scalar type (u8 ... f64, bool); v points to one value of
 * that type in host order. */
int kv_gguf_writer_add_scalar(kv_gguf_writer *w, const char *key, kv_gguf_vtype type, const void *v);
/* A pre-encoded value of type (exactly the bytes that follow the type field
 * in a file, e.g. an array of arrays); validated like the reader does. */
int kv_gguf_writer_add_raw(kv_gguf_writer *w, const char *key, kv_gguf_vtype type, const void *value,
                           size_t nbytes);
/* Arrays of numbers: elem_type is a numeric kv_gguf_vtype, data holds n
 * elements of that type in host (little-endian) order. */
int kv_gguf_writer_add_arr(kv_gguf_writer *w, const char *key, kv_gguf_vtype elem_type,
                           const void *data, uint64_t n);
/* Array of strings (each NUL-terminated; lens may be NULL, else byte
 * lengths so strings may hold NULs). */
int kv_gguf_writer_add_arr_str(kv_gguf_writer *w, const char *key, const char *const *strs,
                               const uint64_t *lens, uint64_t n);
/* Copies every metadata entry of g (except keys for which skip returns 1). */
int kv_gguf_writer_copy_kv(kv_gguf_writer *w, const kv_gguf *g,
                           int (*skip)(const char *key, void *ctx), void *ctx);
/* Adds a tensor; ne[0] is the row length. size must equal the type's row
 * size times the number of rows. */
int kv_gguf_writer_add_tensor(kv_gguf_writer *w, const char *name, kv_type type, int n_dims,
                              const int64_t *ne, const void *data, uint64_t size);
int kv_gguf_writer_add_tensor_ref(kv_gguf_writer *w, const char *name, kv_type type, int n_dims,
                                  const int64_t *ne, const void *data, uint64_t size);
/* Produces rows [row0, row0 + n_rows) of a tensor into dst (n_rows whole
 * rows of kv_type_row_size(type, ne[0]) bytes; a row is one ne[0] run, rows
 * counted over ne[1]*ne[2]*ne[3]). Called in ascending row order. Returns 0
 * or an error code, which aborts the write. */
typedef int (*kv_gguf_fill_fn)(void *ctx, void *dst, int64_t row0, int64_t n_rows);
/* Adds a tensor whose data fill produces at write time (ctx borrowed until
 * kv_gguf_writer_write returns). */
int kv_gguf_writer_add_tensor_fn(kv_gguf_writer *w, const char *name, kv_type type, int n_dims,
                                 const int64_t *ne, kv_gguf_fill_fn fill, void *ctx);
/* Writes the file (to path.tmp, then renames; the .tmp is removed on
 * failure). Tensor names must be shorter than 64 bytes (llama.cpp's limit).
 * Returns 0 or an error. */
int kv_gguf_writer_write(kv_gguf_writer *w, const char *path, kv_err *err);

#endif
