/* cleanup.h - files to remove if the process is interrupted. A command that
 * writes a temporary file (OUT.tmp before a rename, an eval copy) registers
 * it here; the front end installs the signal handlers once, and on SIGINT,
 * SIGTERM or SIGHUP every registered file is unlinked before the process
 * dies of the same signal; a registered directory (the temp directory the
 * files were in) is removed after them. Nothing here allocates. */
#ifndef KV_CLEANUP_H
#define KV_CLEANUP_H

/* Most files registered at once; a registration past it is refused. */
#define KV_CLEANUP_MAX 32

/* Registers path (copied; at most 4095 bytes; a file, or an empty
 * directory once its registered files are gone) for removal on a signal.
 * Returns 0, or KV_ERR_RANGE when the table is full or the path too long
 * (the file is then only not cleaned up; nothing else changes). */
int kv_cleanup_add(const char *path);
/* Forgets path (after it was renamed or removed). Unknown paths: no-op. */
void kv_cleanup_remove(const char *path);
/* Installs handlers for SIGINT, SIGTERM and SIGHUP that unlink every
 * registered file, restore the default action and re-raise the signal, so
 * the exit status still says which signal ended the process. Call once,
 * from main(). Returns 0 or KV_ERR_INVAL when sigaction fails. */
int kv_cleanup_install(void);
/* Unlinks every registered file, then removes every registered directory,
 * now (async-signal-safe); for a front end with signal handlers of its own
 * to call from them. */
void kv_cleanup_run(void);

#endif
