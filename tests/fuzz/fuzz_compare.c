/* fuzz_compare.c - libFuzzer target for "key=v1,v2,..." (the --compare
 * argument of bench and the TUI, engine/compare.c): any text either fails
 * with a message or yields a non-empty key and 1..cap non-empty values that
 * point into the scratch buffer, none with an unbalanced top-level comma;
 * and the side-by-side layout (tui/compare_view.c) for sizes drawn from the
 * input keeps every rectangle on the screen. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/compare.h"
#include "../../tui/compare_view.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int in_buf(const char *p, const char *buf, size_t cap) { return p >= buf && p < buf + cap; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = 0;
    char buf[1024];
    const char *key, *v[KV_CMP_MAX];
    kv_err err;
    int n = kv_compare_parse(s, buf, sizeof buf, &key, v, KV_CMP_MAX, &err);
    if (n < 0) {
        if (!err.msg[0]) __builtin_trap();
    } else {
        if (n < 1 || n > KV_CMP_MAX || !in_buf(key, buf, sizeof buf) || !key[0] || strchr(key, '=') == key)
            __builtin_trap();
        for (int i = 0; i < n; i++) {
            if (!in_buf(v[i], buf, sizeof buf) || !v[i][0] || v[i][0] == ' ') __builtin_trap();
            size_t l = strlen(v[i]);
            if (v[i][l - 1] == ' ') __builtin_trap();
        }
    }
    if (size >= 5) {
        int cols = (data[0] | data[1] << 8) % 5000 - 100, rows = (data[2] | data[3] << 8) % 5000 - 100;
        int m = data[4] % 7 - 1;
        kv_cmp_layout l;
        if (kv_cmp_layout_compute(cols, rows, m, data[4] & 1, &l) == 0 && !l.too_small) {
            kv_rect r[] = {l.title, l.head, l.caption, l.input, l.status};
            for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
                if (r[i].h && (r[i].y < 0 || r[i].x < 0 || r[i].y + r[i].h > rows || r[i].x + r[i].w > cols))
                    __builtin_trap();
            for (int j = 0; j < l.n; j++) {
                kv_rect c[] = {l.label[j], l.blocks[j], l.sched[j], l.tpot[j], l.mem[j], l.chat[j]};
                for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
                    if (c[i].h && (c[i].y < 0 || c[i].x < 0 || c[i].y + c[i].h > rows - 2 || c[i].x + c[i].w > cols))
                        __builtin_trap();
            }
        }
    }
    free(s);
    return 0;
}
