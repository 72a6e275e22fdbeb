/* input.h - the chat input line: GNU readline driven through its callback
 * interface from the curses key loop. readline never touches the terminal
 * (its redisplay and terminal prep are replaced); the panels draw the
 * buffer and cursor from kv_input_view(). Each session keeps its own
 * history (Ctrl-R searches it) and half-typed draft. Readline is global
 * state, so there is one input line per process. */
#ifndef KV_TUI_INPUT_H
#define KV_TUI_INPUT_H

#include "keys.h"

/* Called with each completed line (malloc'ed, the callee frees it; NULL at
 * end-of-file). Multi-line input arrives with '\n' inside. */
typedef void (*kv_input_line_fn)(char *line, void *ctx);

/* Installs the callback handler. 0, or -1 when readline cannot start. */
int kv_input_init(kv_input_line_fn fn, void *ctx);
void kv_input_shutdown(void);

/* Feeds one key (a code point or a KV_KEY_* special, Alt as an ESC prefix)
 * to readline; the line function may run inside. */
void kv_input_feed(kv_key k);

/* What to draw: the prompt readline shows (the Ctrl-R search prompt while
 * searching), the buffer and the cursor as a byte offset into it. */
typedef struct kv_input_view {
    const char *prompt; /* borrowed */
    const char *text;   /* borrowed, NUL-terminated */
    int point;          /* cursor byte offset in text */
    int searching;      /* bool: an incremental history search is active */
} kv_input_view;
void kv_input_view_get(kv_input_view *v);
int kv_input_empty(void);
/* 1 when readline redrew since the last call (the app then repaints). */
int kv_input_dirty(void);

/* Replaces the buffer (cursor at the end). */
void kv_input_set_text(const char *text);

/* Per-session history and draft. _new returns an empty history state;
 * _switch stores the active history and draft into *from_hist / *from_draft
 * (malloc'ed; a previous value there is freed) and activates *to_hist (taken
 * over and set to NULL; NULL: an empty history) and to_draft (copied).
 * The active session's slot therefore always holds NULL. _free releases a
 * history that is not active (NULL is a no-op); kv_input_shutdown frees
 * the active one. */
void *kv_input_history_new(void);
void kv_input_history_switch(void **from_hist, char **from_draft, void **to_hist, const char *to_draft);
void kv_input_history_free(void *hist);
/* Adds a line to the active history. */
void kv_input_history_add(const char *line);

#endif
