/* json.h - a small strict JSON reader (RFC 8259: no comments, no trailing
 * commas, no NaN, UTF-8 only, duplicate keys rejected, bounded depth) and a
 * streaming writer to a FILE*. Used for workload prompt files (JSONL) and
 * machine-readable output (kvtop bench --json, --outputs). */
#ifndef KV_JSON_H
#define KV_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../base/common.h"

#define KV_JSON_MAX_DEPTH 64 /* nesting of arrays/objects, reader and writer */

typedef enum kv_json_type {
    KV_JSON_NULL = 0,
    KV_JSON_BOOL,
    KV_JSON_NUMBER,
    KV_JSON_STRING,
    KV_JSON_ARRAY,
    KV_JSON_OBJECT
} kv_json_type;

/* A parsed value. Opaque; every node of one document lives in one arena
 * owned by the root. */
typedef struct kv_json kv_json;

/* ---- reading ---- */

/* Parses exactly one JSON value from text[0..len) (whitespace around it is
 * allowed; text need not be NUL-terminated). Returns the root, to be freed
 * with kv_json_free, or NULL with err filled: "line L, column C: what"
 * (KV_ERR_FORMAT, or KV_ERR_NOMEM). Columns count bytes from 1. */
kv_json *kv_json_parse(const char *text, size_t len, kv_err *err);
/* The same, with messages "name:L:C: what" where L counts from first_line
 * (a JSONL reader passes the line it is on). */
kv_json *kv_json_parse_named(const char *text, size_t len, const char *name, int first_line, kv_err *err);
/* Frees a document; v must be a root returned by kv_json_parse. NULL is a no-op. */
void kv_json_free(kv_json *v);

/* Accessors; they accept NULL and the wrong type, returning the neutral
 * value (KV_JSON_NULL, 0, NULL). Pointers borrow from the document. */
kv_json_type kv_json_type_of(const kv_json *v);
int kv_json_bool(const kv_json *v);
double kv_json_number(const kv_json *v);
/* NUL-terminated UTF-8; *len (if not NULL) gets the byte length, which
 * counts embedded NULs that a \u0000 escape produced. */
const char *kv_json_str(const kv_json *v, size_t *len /* OUT: may be NULL */);
/* Elements of an array or members of an object (0 for anything else). */
size_t kv_json_len(const kv_json *v);
/* Element i of an array, or the value of member i of an object. */
const kv_json *kv_json_at(const kv_json *v, size_t i);
/* Key of member i of an object (NUL-terminated; *len as for kv_json_str). */
const char *kv_json_key_at(const kv_json *v, size_t i, size_t *len /* OUT: may be NULL */);
/* The value of member `key` of an object, or NULL. */
const kv_json *kv_json_get(const kv_json *obj, const char *key);

/* ---- writing ---- */

/* A streaming writer. Misuse (a key outside an object, a value where a key
 * is due, unbalanced ends, more than KV_JSON_MAX_DEPTH levels) and write
 * errors are remembered and reported by kv_json_writer_finish; nothing
 * aborts. Plain data so it can live on the stack. */
typedef struct kv_json_writer {
    FILE *f;                                 /* borrowed */
    int pretty;                              /* 1: newlines and two-space indents */
    int depth;                               /* open containers */
    unsigned char kind[KV_JSON_MAX_DEPTH];   /* 'o' object or 'a' array, per level */
    int count[KV_JSON_MAX_DEPTH];            /* members/elements written, per level */
    int want_value;                          /* a key was written; its value is due */
    int done;                                /* the top-level value is complete */
    int err;                                 /* first error: KV_ERR_INVAL misuse, KV_ERR_IO */
} kv_json_writer;

void kv_json_writer_init(kv_json_writer *w, FILE *f, int pretty);
void kv_json_write_begin_object(kv_json_writer *w);
void kv_json_write_end_object(kv_json_writer *w);
void kv_json_write_begin_array(kv_json_writer *w);
void kv_json_write_end_array(kv_json_writer *w);
void kv_json_write_key(kv_json_writer *w, const char *key);
/* Strings are escaped; bytes that are not UTF-8 become U+FFFD so the output
 * is always valid JSON. NULL writes null. */
void kv_json_write_string(kv_json_writer *w, const char *s);
void kv_json_write_string_n(kv_json_writer *w, const char *s, size_t n);
/* Shortest text that reads back to exactly v; NaN and infinities (which
 * JSON cannot say) become null. */
void kv_json_write_number(kv_json_writer *w, double v);
void kv_json_write_int(kv_json_writer *w, int64_t v);
void kv_json_write_uint(kv_json_writer *w, uint64_t v);
void kv_json_write_bool(kv_json_writer *w, int v);
void kv_json_write_null(kv_json_writer *w);
/* A key and its value in one call (a member of the open object), written
 * as the calls above write them; a NULL string writes null. */
void kv_json_field_num(kv_json_writer *w, const char *key, double v);
void kv_json_field_int(kv_json_writer *w, const char *key, int64_t v);
void kv_json_field_uint(kv_json_writer *w, const char *key, uint64_t v);
void kv_json_field_str(kv_json_writer *w, const char *key, const char *v);
void kv_json_field_bool(kv_json_writer *w, const char *key, int v);
/* A key and an array of v[0..n) (v may be NULL when n is 0). */
void kv_json_field_ints(kv_json_writer *w, const char *key, const int64_t *v, size_t n);
void kv_json_field_uints(kv_json_writer *w, const char *key, const uint64_t *v, size_t n);
/* Writes a parsed value (deep). */
void kv_json_write_value(kv_json_writer *w, const kv_json *v);
/* 0 when exactly one complete value was written without error; otherwise
 * the first error (KV_ERR_INVAL for misuse or an unfinished value,
 * KV_ERR_IO when the stream failed). Writes nothing itself: a JSONL writer
 * adds the '\n' and calls kv_json_writer_init again for the next line. */
int kv_json_writer_finish(kv_json_writer *w);

#endif
