/* profile.h - YAML profiles and --set overrides into a kv_config.
 * One key table (engine/config.h, kv_config_keys) drives the YAML loader,
 * --set, the config dump and --help. Errors name file:line:column and the
 * dotted key; a failed call leaves the caller's kv_config untouched.
 *
 *   kv_config cfg;
 *   kv_err err;
 *   if (kv_profile_load_with_sets(path, sets, n_sets, &cfg, &err)) {
 *       fprintf(stderr, "kvtop: %s\n", err.msg);   // "p.yaml:4:15: kv.block_size: ..."
 *       return 2;
 *   }
 */
#ifndef KV_PROFILE_H
#define KV_PROFILE_H

#include <stddef.h>
#include <stdio.h>

#include "../engine/config.h"

/* Loads the profile at `path` on top of kv_config_default(), then runs
 * kv_config_validate(). Strict: unknown keys (with a "did you mean"),
 * wrong types, out-of-range values, duplicate keys, invalid YAML and a
 * missing file are errors naming file:line:column. Returns 0, or
 * KV_ERR_IO (cannot read) / KV_ERR_FORMAT (bad YAML) / KV_ERR_INVAL (bad
 * key or value) with err filled; *cfg is written only on success. */
int kv_profile_load(const char *path, kv_config *cfg, kv_err *err);

/* The same from memory; `name` is what messages call the input. buf need
 * not be NUL-terminated. */
int kv_profile_load_mem(const char *buf, size_t len, const char *name, kv_config *cfg, kv_err *err);

/* Applies one "key=value" override to *cfg: "kv.prefix_sharing=false",
 * "workload.prompt_len=64" (a fixed length), "workload.prompt_len.mean=200"
 * (one field of a distribution), "workload.prompt_len={dist: uniform, min: 8,
 * max: 64}". The value is parsed and range checked as in a profile; on error
 * *cfg is unchanged. Cross-key checks are NOT run here (a sequence of --set
 * may pass through inconsistent states): call kv_config_validate() after the
 * last one, or use kv_profile_load_with_sets(). */
int kv_profile_set(kv_config *cfg, const char *assignment, kv_err *err);

/* What a front end wants: defaults, then the profile at `path` (NULL: none),
 * then each of sets[0..n_sets) in order, then kv_config_validate(). A
 * validation error points at the file:line:column or the --set that set the
 * offending key. *cfg is written only on success. */
int kv_profile_load_with_sets(const char *path, const char *const *sets, int n_sets, kv_config *cfg,
                              kv_err *err);

/* Writes the whole effective config as a YAML profile that
 * kv_profile_load reads back to the same config (--print-config, traces).
 * Returns 0 or KV_ERR_IO. */
int kv_profile_dump(const kv_config *cfg, FILE *f);

/* Lists every key with its type, range or choices, default and a line of
 * documentation (for --help). */
void kv_profile_print_keys(FILE *f);

#endif
