/* blockfill.h - how full each KV block is, for the block map: a block's
 * fill (slots holding tokens out of block_size) as one of five marks, the
 * same for a map cell that stands for several blocks, and the one-line
 * utilisation gauge under the map (slots holding tokens / slots reserved).
 * Pure: panels_kv.c paints the result; tests/tui/test_blockfill.c checks it.
 *
 * Marks, emptiest first: UTF-8 " ▁▃▅█", ASCII (mono theme, non-UTF-8
 * terminals) " _-=#". Level 0 is a reserved block holding no token (blank,
 * so a contiguous reservation reads as a run of empty cells), 4 a full one;
 * 1..3 split the partly filled ones in thirds. */
#ifndef KV_TUI_BLOCKFILL_H
#define KV_TUI_BLOCKFILL_H

#include <stddef.h>
#include <stdint.h>

#include "../engine/engine.h"

#define KV_BLOCKFILL_LEVELS 5

/* The mark level of filled slots out of capacity: 0 when filled <= 0, 4
 * when filled >= capacity, else 1 + 3 * filled / capacity (1..3). A
 * capacity <= 0 gives 0. */
int kv_blockfill_level(int64_t filled, int64_t capacity);
/* The mark of a level (clamped to [0, 4]) as a NUL-terminated string of one
 * column: UTF-8 when utf8, else ASCII. Static storage. */
const char *kv_blockfill_mark(int level, int utf8);
/* Slots holding tokens (*held: the fill of every block in use) and slots
 * reserved (*reserved: blocks in use x block_size) over blocks[0..n).
 * Cached and free blocks count in neither. */
void kv_blockfill_count(const kv_snap_block *blocks, int n, int block_size, uint64_t *held /* OUT: */,
                        uint64_t *reserved /* OUT: */);
/* The level of each map cell: cell c stands for blocks [c*per_cell,
 * (c+1)*per_cell) of blocks[0..n_blocks), and its level is that of the
 * summed fill of its blocks in use over their capacity (0 when none is in
 * use). Writes levels[0..cells). Returns 0, or -1 for a bad argument
 * (per_cell or block_size < 1, cells < 0, NULL levels), levels untouched. */
int kv_blockfill_cells(const kv_snap_block *blocks, int n_blocks, int per_cell, int block_size,
                       uint8_t *levels /* OUT: (cells) */, int cells);
/* The gauge line into buf, at most width columns:
 * "fill [#####.....] 23% of reserved slots hold tokens (412/1776)", the bar
 * as wide as the room left allows (no bar below 4 columns of room, then the
 * words shorten), UTF-8 bar cells when utf8. reserved 0 reads "fill: no
 * slots reserved". Returns the columns written (buf always terminated). */
int kv_blockfill_gauge(char *buf, size_t cap, uint64_t held, uint64_t reserved, int width, int utf8);

#endif
