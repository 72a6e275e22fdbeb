/* cli.h - small helpers shared by the command-line subcommands: option
 * value parsing with clear errors. */
#ifndef KV_CLI_H
#define KV_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "../base/common.h"

/* Parses argv[*i + 1] as the value of option argv[*i], advancing *i.
 * Prints "kvtop CMD: OPTION needs a value" / "... is not a valid number" and
 * returns -1 on error. */
int cli_str(int argc, char **argv, int *i, const char **out);
int cli_int(int argc, char **argv, int *i, long lo, long hi, int *out);
int cli_u64(int argc, char **argv, int *i, uint64_t *out);
int cli_float(int argc, char **argv, int *i, double lo, double hi, float *out);
/* Reads a whole file into a NUL-terminated malloc'd buffer (*len bytes;
 * len may be NULL); NULL when it cannot (base/file.h's kv_read_file, no
 * size cap). */
char *cli_read_file(const char *path, size_t *len);
/* Reads a prompt file (-f) into a NUL-terminated malloc'd buffer (*len
 * bytes; len may be NULL). A prompt is text, and every path a prompt takes
 * (chat messages, the engine's text requests, the echo) is a C string, so a
 * file holding a NUL byte is refused, naming the byte's offset, instead of
 * being cut at it: `generate -f` and `tokenize -f` follow this one rule.
 * NULL with err filled ("FILE: cannot open: ...", "FILE: byte N is a NUL
 * ..."). */
char *cli_read_prompt(const char *path, size_t *len, kv_err *err);
/* Human-readable byte count ("1.50 GiB", "12.0 MiB": base/fmt.h's
 * kv_format_bytes, as the TUI shows it) into buf; returns buf. */
const char *cli_bytes(uint64_t n, char *buf, size_t cap);

/* ---- a table-driven option parser ------------------------------------------
 * A command lists its options once; cli_parse walks argv against the list.
 * Options that set a profile key (CLI_KEY) go through the key table's own
 * parser (kv_config_key_parse), so `--top-k 99999999` and `--set
 * sampling.top_k=99999999` give the same range and the same message. Every
 * value-taking option also accepts --name=value. */

#include <stdio.h>

#include "../engine/config.h"

typedef enum cli_opt_kind {
    CLI_FLAG = 0, /* no value: *(int *)dst = 1 */
    CLI_STR,      /* *(const char **)dst = the value (borrowed from argv) */
    CLI_INT,      /* *(int *)dst = the value, an integer in [lo, hi] */
    CLI_KEY,      /* the value of profile key `key`, parsed and range checked into the config */
    CLI_LIST      /* repeatable: the value is appended to *(cli_list *)dst */
} cli_opt_kind;

typedef struct cli_list {
    const char **v; /* (cap) the values, borrowed (from argv); malloc'ed, free with cli_list_free */
    int n, cap;
} cli_list;

typedef struct cli_opt {
    const char *name;  /* "--top-k" */
    const char *alias; /* "-k", or NULL */
    cli_opt_kind kind;
    void *dst;         /* FLAG, INT: int *; STR: const char **; LIST: cli_list *; KEY: unused */
    const char *key;   /* KEY: the dotted key ("sampling.top_k") */
    long lo, hi;       /* INT: the allowed range */
} cli_opt;

typedef struct cli_spec {
    const char *cmd;          /* the command, for messages ("generate") */
    const cli_opt *opts;      /* (n_opts) */
    int n_opts;
    void (*usage)(FILE *f);   /* printed for -h/--help (stdout) and after an unknown option (stderr) */
    kv_config *cfg;           /* CLI_KEY options write here; may be NULL when there are none */
    const char **pos;         /* (max_pos) positional arguments, borrowed from argv */
    int max_pos;              /* 0: none allowed */
    int *n_pos;               /* OUT: positional arguments found; may be NULL when max_pos is 0 */
} cli_spec;

/* The sampling flags every command that generates takes, each one a key of
 * the table (its range and its messages): put it in a cli_opt array. */
#define CLI_SAMPLING_OPTS                                                          \
    {"--temp", NULL, CLI_KEY, NULL, "sampling.temperature", 0, 0},                 \
    {"--top-k", NULL, CLI_KEY, NULL, "sampling.top_k", 0, 0},                      \
    {"--top-p", NULL, CLI_KEY, NULL, "sampling.top_p", 0, 0},                      \
    {"--min-p", NULL, CLI_KEY, NULL, "sampling.min_p", 0, 0},                      \
    {"--repeat-penalty", NULL, CLI_KEY, NULL, "sampling.repeat_penalty", 0, 0},    \
    {"--repeat-last-n", NULL, CLI_KEY, NULL, "sampling.repeat_last_n", 0, 0},      \
    {"--seed", NULL, CLI_KEY, NULL, "sampling.seed", 0, 0}

enum { CLI_OK = 0, CLI_HELP = 1 };

/* Parses argv[1..argc) (argv[0] is the command) against s. Returns CLI_OK,
 * CLI_HELP when -h/--help printed the usage (the command then exits 0), or
 * KV_ERR_INVAL after printing "kvtop CMD: ..." for an unknown option (then
 * the usage too), a missing or bad value, or too many positional arguments
 * (the command then exits 2). Values already stored stay stored; lists
 * hold what was parsed (free them either way). */
int cli_parse(const cli_spec *s, int argc, char **argv);
/* The exit status for a cli_parse result other than CLI_OK: 0 for CLI_HELP, 2 otherwise. */
int cli_parse_exit(int rc);
/* Appends v (borrowed) to l. Returns 0 or KV_ERR_NOMEM (l unchanged). */
int cli_list_add(cli_list *l, const char *v);
void cli_list_free(cli_list *l); /* NULL is a no-op; leaves it empty */

#endif
