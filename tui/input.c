/* input.c - GNU readline in callback mode under curses (see input.h). Keys
 * from the curses loop go into a small byte queue that readline reads
 * through rl_getc_function; readline's own terminal handling, signal
 * handling and redisplay are switched off, so curses stays the only thing
 * that writes to the terminal. */
#include "input.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <readline/history.h>
#include <readline/readline.h>

#include "../base/utf8.h"

static unsigned char queue[256]; /* bytes waiting for readline */
static int q_head, q_tail;
static int dirty;
static int in_handler;
static char *pending_text; /* set_text requested inside the line handler */
static kv_input_line_fn line_fn;
static void *line_ctx;
static FILE *devnull;
static int active;

static int getc_fn(FILE *f) {
    (void)f;
    if (q_head == q_tail) return 0; /* never asked for when empty (see kv_input_feed) */
    return queue[q_head++];
}
static int avail_fn(void) { return q_head != q_tail; }
static void redisplay_fn(void) { dirty = 1; }
static void prep_fn(int meta) { (void)meta; }
static void deprep_fn(void) {}

static void handler(char *line) {
    in_handler = 1;
    if (line_fn) line_fn(line, line_ctx);
    else free(line);
    in_handler = 0;
    dirty = 1;
}

/* Alt-Enter: a new line inside the input instead of sending it. */
static int insert_newline(int count, int key) {
    (void)key;
    for (int i = 0; i < (count > 0 ? count : 1); i++) rl_insert_text("\n");
    return 0;
}

int kv_input_init(kv_input_line_fn fn, void *ctx) {
    line_fn = fn;
    line_ctx = ctx;
    if (!devnull) devnull = fopen("/dev/null", "w");
    if (!devnull) return -1;
    rl_readline_name = "kvtop";
    rl_catch_signals = 0;
    rl_catch_sigwinch = 0;
    rl_change_environment = 0; /* LINES/COLUMNS in the environment would pin curses' size */
    rl_prep_term_function = prep_fn;
    rl_deprep_term_function = deprep_fn;
    rl_getc_function = getc_fn;
    rl_input_available_hook = avail_fn;
    rl_redisplay_function = redisplay_fn;
    rl_outstream = devnull; /* bells, completion lists: nowhere */
    rl_instream = NULL;
    rl_variable_bind("bell-style", "none");
    rl_variable_bind("enable-bracketed-paste", "off");
    rl_variable_bind("horizontal-scroll-mode", "on");
    rl_add_defun("kvtop-newline", insert_newline, -1);
    rl_callback_handler_install("> ", handler);
    /* The escape sequences kv_input_feed sends for special keys; bound
     * explicitly so a user's inputrc or terminal type cannot unbind them. */
    rl_bind_keyseq("\\e[A", rl_get_previous_history);
    rl_bind_keyseq("\\e[B", rl_get_next_history);
    rl_bind_keyseq("\\e[C", rl_forward_char);
    rl_bind_keyseq("\\e[D", rl_backward_char);
    rl_bind_keyseq("\\e[H", rl_beg_of_line);
    rl_bind_keyseq("\\e[F", rl_end_of_line);
    rl_bind_keyseq("\\e[3~", rl_delete);
    rl_bind_keyseq("\\e\\r", insert_newline);
    rl_bind_keyseq("\\e\\n", insert_newline);
    rl_bind_key('\t', rl_insert); /* never reached (Tab switches focus); no completion */
    using_history();
    active = 1;
    dirty = 1;
    return 0;
}

void kv_input_shutdown(void) {
    if (!active) return;
    rl_callback_handler_remove();
    /* Release the active history too. */
    HISTORY_STATE *st = history_get_history_state();
    HISTORY_STATE empty;
    memset(&empty, 0, sizeof empty);
    history_set_history_state(&empty);
    kv_input_history_free(st);
    free(pending_text);
    pending_text = NULL;
    if (devnull) fclose(devnull);
    devnull = NULL;
    rl_outstream = NULL;
    active = 0;
}

static void push(const char *bytes, int n) {
    for (int i = 0; i < n; i++) {
        if (q_tail == (int)sizeof queue) break;
        queue[q_tail++] = (unsigned char)bytes[i];
    }
}

void kv_input_feed(kv_key k) {
    if (!active) return;
    q_head = q_tail = 0;
    const char *seq = NULL;
    char b[4];
    int nb = 0;
    switch (k.code) {
    case KV_KEY_UP: seq = "\033[A"; break;
    case KV_KEY_DOWN: seq = "\033[B"; break;
    case KV_KEY_RIGHT: seq = "\033[C"; break;
    case KV_KEY_LEFT: seq = "\033[D"; break;
    case KV_KEY_HOME: seq = "\033[H"; break;
    case KV_KEY_END: seq = "\033[F"; break;
    case KV_KEY_DELETE: seq = "\033[3~"; break;
    case KV_KEY_BACKSPACE: seq = "\177"; break;
    case KV_KEY_ENTER: seq = "\r"; break;
    default: break;
    }
    if (k.alt) push("\033", 1);
    if (seq) {
        push(seq, (int)strlen(seq));
    } else if (k.code >= 0 && k.code < KV_KEY_BASE && (nb = (int)kv_utf8_encode((uint32_t)k.code, b)) > 0) {
        push(b, nb); /* a code point: its UTF-8 (a surrogate has none) */
    } else {
        return; /* a special key readline has no use for */
    }
    /* Each call consumes at least one byte; the bound only guards against
     * a readline that stops reading. */
    for (int guard = 0; q_head != q_tail && guard < (int)sizeof queue; guard++) rl_callback_read_char();
    q_head = q_tail = 0;
    if (pending_text) {
        char *t = pending_text;
        pending_text = NULL;
        kv_input_set_text(t);
        free(t);
    }
}

void kv_input_view_get(kv_input_view *v) {
    v->prompt = rl_display_prompt ? rl_display_prompt : "> ";
    v->text = rl_line_buffer ? rl_line_buffer : "";
    v->point = rl_point;
    if (v->point < 0) v->point = 0;
    if (v->point > (int)strlen(v->text)) v->point = (int)strlen(v->text);
    v->searching = RL_ISSTATE(RL_STATE_ISEARCH) ? 1 : 0;
}

int kv_input_empty(void) { return !rl_line_buffer || rl_end == 0; }

int kv_input_dirty(void) {
    int d = dirty;
    dirty = 0;
    return d;
}

void kv_input_set_text(const char *text) {
    if (!text) text = "";
    if (in_handler || !active) {
        /* readline resets the line after the handler returns: apply later. */
        free(pending_text);
        pending_text = strdup(text);
        return;
    }
    rl_replace_line(text, 1);
    rl_point = rl_end;
    dirty = 1;
}

void *kv_input_history_new(void) { return calloc(1, sizeof(HISTORY_STATE)); }

void kv_input_history_switch(void **from_hist, char **from_draft, void **to_hist, const char *to_draft) {
    /* The outgoing session gets a copy of the active state (the entries
     * move with it); the active session's slot is always NULL. */
    HISTORY_STATE *now = history_get_history_state();
    if (from_hist) {
        free(*from_hist);
        *from_hist = now;
    } else {
        free(now);
    }
    if (from_draft) {
        free(*from_draft);
        /* Inside the line handler the buffer still holds the line just
         * accepted: that is history, not a draft. */
        *from_draft = !in_handler && rl_line_buffer && rl_end > 0 ? strdup(rl_line_buffer) : NULL;
    }
    HISTORY_STATE empty;
    memset(&empty, 0, sizeof empty);
    /* set copies the fields in: the incoming struct is consumed. */
    history_set_history_state(to_hist && *to_hist ? (HISTORY_STATE *)*to_hist : &empty);
    if (to_hist) {
        free(*to_hist);
        *to_hist = NULL;
    }
    using_history();
    kv_input_set_text(to_draft ? to_draft : "");
}

void kv_input_history_free(void *hist) {
    HISTORY_STATE *st = hist;
    if (!st) return;
    for (int i = 0; i < st->length; i++) {
        if (!st->entries || !st->entries[i]) continue;
        histdata_t d = free_history_entry(st->entries[i]);
        free(d);
    }
    free(st->entries);
    free(st);
}

void kv_input_history_add(const char *line) {
    if (line && *line) add_history(line);
}
