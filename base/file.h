/* file.h - the one read-a-whole-file helper: a file into one NUL-terminated
 * heap buffer, with a size cap so an outside path cannot make a loader take
 * all memory, and errors that name the file; and the check that an output
 * path is not one of a command's inputs. */
#ifndef KV_FILE_H
#define KV_FILE_H

#include <stddef.h>

#include "common.h"

/* Reads the file at `path` into a new buffer of its bytes plus a NUL.
 * On success returns 0, *out owns the buffer (free() it) and *len (when
 * not NULL) holds the byte count without the NUL. Errors, with *out NULL
 * and a message in err starting with the path:
 *   KV_ERR_IO      cannot open ("PATH: cannot open: REASON") or read
 *   KV_ERR_FORMAT  the file holds more than max_bytes bytes
 *                  ("PATH: larger than N bytes")
 *   KV_ERR_NOMEM   out of memory
 * max_bytes 0 means no cap beyond what memory holds. */
int kv_read_file(const char *path, size_t max_bytes, char **out /* OUT: the bytes, NUL-terminated */,
                 size_t *len /* OUT: byte count, may be NULL */, kv_err *err);

/* Whether paths a and b name one file: the same device and inode, so a
 * hard link, a symbolic link or another spelling of the path counts.
 * Returns 1 when they do, 0 when they differ or either cannot be stat'ed
 * (a file that does not exist yet is nobody's input). */
int kv_same_file(const char *a, const char *b);

#endif
