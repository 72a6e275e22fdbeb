/* cli.h - small helpers shared by the command-line subcommands: option
 * value parsing with clear errors. */
#ifndef KV_CLI_H
#define KV_CLI_H

#include <stddef.h>
#include <stdint.h>

/* Parses argv[*i + 1] as the value of option argv[*i], advancing *i.
 * Prints "kvtop CMD: OPTION needs a value" / "... is not a valid number" and
 * returns -1 on error. */
int cli_str(int argc, char **argv, int *i, const char **out);
int cli_int(int argc, char **argv, int *i, long lo, long hi, int *out);
int cli_u64(int argc, char **argv, int *i, uint64_t *out);
int cli_float(int argc, char **argv, int *i, double lo, double hi, float *out);
/* Reads a whole file into a NUL-terminated malloc'd buffer (*len bytes). */
char *cli_read_file(const char *path, size_t *len);
/* Human-readable byte count ("1.5 GiB") into buf. */
const char *cli_bytes(uint64_t n, char *buf, size_t cap);

#endif
