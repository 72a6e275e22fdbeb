/* fmt.h - number formatters every front end shares, so the CLI and the
 * TUI print the same value the same way. */
#ifndef KV_FMT_H
#define KV_FMT_H

#include <stddef.h>
#include <stdint.h>

/* A byte count in binary units with three significant digits: "0 B",
 * "1023 B", "1.50 KiB", "12.0 MiB", "300 GiB", up to "16.0 EiB". Writes at
 * most cap - 1 bytes plus a NUL (a short buffer cuts the text) and returns
 * the bytes written; buf NULL or cap 0 writes nothing and returns 0. */
int kv_format_bytes(char *buf /* OUT: (cap) */, size_t cap, uint64_t bytes);

#endif
