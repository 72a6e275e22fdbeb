/* fuzz_tui_text.c - libFuzzer target for the TUI's text handling: slash
 * command parsing of any input line, and UTF-8 width, fitting and word
 * wrapping of any bytes at many widths (every line must fit its width
 * unless it is one character wider than the line, lines must stay inside
 * the text and in order). The tui/ sources are compiled in here. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../tui/format.c"
#include "../../tui/keys.c"
#include "../../tui/layout.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 8192) return 0;
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = 0;
    int len = (int)strlen(s); /* up to the first NUL, as a typed line */
    kv_command c;
    char msg[256];
    if (kv_command_parse(s, &c, msg, sizeof msg) == 0) {
        if (c.kind == KV_CMD_NONE && (!c.prompt || c.prompt < s || c.prompt > s + len)) __builtin_trap();
        if (strlen(c.arg) >= sizeof c.arg) __builtin_trap();
    } else if (!msg[0]) {
        __builtin_trap();
    }
    int w = kv_format_width(s, len);
    if (w < 0) __builtin_trap();
    static const int widths[] = {1, 2, 3, 7, 16, 80};
    for (size_t k = 0; k < sizeof widths / sizeof widths[0]; k++) {
        int cols = widths[k];
        kv_wrap_iter it;
        kv_wrap_line l;
        kv_format_wrap_begin(&it);
        int prev_end = 0, n = 0;
        while (kv_format_wrap_next(s, len, cols, &it, &l)) {
            if (l.off < prev_end || l.len < 0 || l.off + l.len > len) __builtin_trap();
            int lw = kv_format_width(s + l.off, l.len);
            if (lw > cols && lw > 2) __builtin_trap();
            prev_end = l.off + l.len;
            if (++n > len + 2) __builtin_trap(); /* always progresses */
        }
        char fit[128];
        kv_format_fit(fit, sizeof fit, s, cols);
        if (kv_format_width(fit, -1) > cols) __builtin_trap();
    }
    free(s);
    return 0;
}
