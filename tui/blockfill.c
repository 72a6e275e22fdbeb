/* blockfill.c - block fill marks and the utilisation gauge (see
 * blockfill.h). Pure: no curses. */
#include "blockfill.h"

#include <stdio.h>
#include <string.h>

int kv_blockfill_level(int64_t filled, int64_t capacity) {
    if (capacity <= 0 || filled <= 0) return 0;
    if (filled >= capacity) return 4;
    return 1 + (int)(3 * filled / capacity);
}

const char *kv_blockfill_mark(int level, int utf8) {
    static const char *const u[KV_BLOCKFILL_LEVELS] = {" ", "\u2581", "\u2583", "\u2585", "\u2588"};
    static const char *const a[KV_BLOCKFILL_LEVELS] = {" ", "_", "-", "=", "#"};
    if (level < 0) level = 0;
    if (level >= KV_BLOCKFILL_LEVELS) level = KV_BLOCKFILL_LEVELS - 1;
    return utf8 ? u[level] : a[level];
}

void kv_blockfill_count(const kv_snap_block *blocks, int n, int block_size, uint64_t *held, uint64_t *reserved) {
    uint64_t h = 0, r = 0;
    for (int i = 0; blocks && i < n && block_size > 0; i++) {
        if (blocks[i].state != 1 /* KV_BLOCK_USED */) continue;
        h += blocks[i].fill < block_size ? blocks[i].fill : (uint64_t)block_size;
        r += (uint64_t)block_size;
    }
    *held = h;
    *reserved = r;
}

int kv_blockfill_cells(const kv_snap_block *blocks, int n_blocks, int per_cell, int block_size, uint8_t *levels,
                       int cells) {
    if (per_cell < 1 || block_size < 1 || cells < 0 || !levels) return -1;
    if (!blocks || n_blocks < 0) n_blocks = 0;
    for (int c = 0; c < cells; c++) {
        int64_t lo = (int64_t)c * per_cell, hi = lo + per_cell;
        if (hi > n_blocks) hi = n_blocks;
        int64_t filled = 0, cap = 0;
        for (int64_t i = lo; i < hi; i++) {
            if (blocks[i].state != 1) continue;
            filled += blocks[i].fill < block_size ? blocks[i].fill : block_size;
            cap += block_size;
        }
        levels[c] = (uint8_t)kv_blockfill_level(filled, cap);
    }
    return 0;
}

int kv_blockfill_gauge(char *buf, size_t cap, uint64_t held, uint64_t reserved, int width, int utf8) {
    if (!buf || cap == 0) return 0;
    buf[0] = 0;
    if (width <= 0) return 0;
    char tail[96];
    int pct = 0;
    if (reserved == 0) {
        snprintf(tail, sizeof tail, "fill: no slots reserved");
    } else {
        if (held > reserved) held = reserved;
        pct = (int)(100.0 * (double)held / (double)reserved + 0.5);
        snprintf(tail, sizeof tail, " %d%% of reserved slots hold tokens (%llu/%llu)", pct, (unsigned long long)held,
                 (unsigned long long)reserved);
    }
    int tail_w = (int)strlen(tail); /* ASCII only */
    int bar = reserved == 0 ? 0 : width - 7 - tail_w; /* "fill [" + "]" */
    if (bar > 40) bar = 40;
    size_t len = 0;
    if (reserved && bar >= 4) {
        int on = (int)((double)bar * (double)held / (double)reserved + 0.5);
        len += (size_t)snprintf(buf, cap, "fill [");
        for (int i = 0; i < bar && len + 4 < cap; i++) {
            const char *c = i < on ? (utf8 ? "\u2588" : "#") : (utf8 ? "\u2591" : ".");
            size_t l = strlen(c);
            memcpy(buf + len, c, l);
            len += l;
        }
        if (len + 1 < cap) buf[len++] = ']';
        buf[len] = 0;
        snprintf(buf + len, cap - len, "%s", tail);
        return bar + 7 + tail_w > width ? width : bar + 7 + tail_w;
    }
    /* No room for a bar: the words alone, shortened to fit. */
    if (reserved) snprintf(tail, sizeof tail, "fill %d%% (%llu/%llu slots)", pct, (unsigned long long)held,
                           (unsigned long long)reserved);
    int w = (int)strlen(tail);
    if (w > width) w = width;
    if ((size_t)w + 1 > cap) w = (int)cap - 1;
    memcpy(buf, tail, (size_t)w);
    buf[w] = 0;
    return w;
}
