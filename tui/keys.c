/* keys.c - key bindings and slash-command parsing (see keys.h). Pure: the
 * app turns curses keys into kv_key and executes the returned actions. */
#include "keys.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"

static kv_action act(kv_action_type t, int arg) {
    kv_action a = {t, arg};
    return a;
}

/* Bindings that work in either focus. */
static int global_key(kv_key k, const kv_key_ctx *c, kv_action *out) {
    int page = c->page > 0 ? c->page : 10;
    if (!k.alt) {
        switch (k.code) {
        case KV_KEY_CTRL('c'): *out = act(KV_ACT_QUIT, 0); return 1;
        case KV_KEY_F(1): *out = act(KV_ACT_HELP, 0); return 1;
        case KV_KEY_F(2): *out = act(KV_ACT_PAUSE, 0); return 1;
        case KV_KEY_F(3): *out = act(KV_ACT_STEP, 0); return 1;
        case KV_KEY_F(4): *out = act(KV_ACT_SLOW, 0); return 1;
        case KV_KEY_F(5): *out = act(KV_ACT_LOAD, 0); return 1;
        case KV_KEY_F(6): *out = act(KV_ACT_ZOOM_NEXT, 0); return 1;
        case KV_KEY_F(7): *out = act(KV_ACT_RECORD, 0); return 1;
        case KV_KEY_F(8): *out = act(KV_ACT_THEME, 0); return 1;
        case KV_KEY_F(9): *out = act(KV_ACT_FILL, 0); return 1;
        case KV_KEY_F(10): *out = act(KV_ACT_QUIT, 0); return 1;
        case KV_KEY_TAB:
        case KV_KEY_BTAB: *out = act(KV_ACT_FOCUS_TOGGLE, 0); return 1;
        case KV_KEY_RESIZE: *out = act(KV_ACT_RESIZE, 0); return 1;
        case KV_KEY_CTRL('l'): *out = act(KV_ACT_REDRAW, 0); return 1;
        case KV_KEY_CTRL('z'): *out = act(KV_ACT_SUSPEND, 0); return 1;
        case KV_KEY_WHEEL_UP: *out = act(KV_ACT_SCROLL, 3); return 1;
        case KV_KEY_WHEEL_DOWN: *out = act(KV_ACT_SCROLL, -3); return 1;
        case KV_KEY_ESC:
            if (c->reply_in_flight) *out = act(KV_ACT_CANCEL, 0);
            else if (c->zoomed) *out = act(KV_ACT_ZOOM_OFF, 0);
            else if (c->focus == KV_FOCUS_PANELS) *out = act(KV_ACT_FOCUS_INPUT, 0);
            else *out = act(KV_ACT_NONE, 0);
            return 1;
        default: break;
        }
        (void)page;
        return 0;
    }
    /* Alt bindings: chosen to leave readline's word motions (M-b, M-f, M-d,
     * M-backspace, M-.) alone. */
    int ch = k.code;
    if (ch >= '1' && ch <= '9') {
        *out = act(KV_ACT_TAB_GOTO, ch - '1');
        return 1;
    }
    switch (ch) {
    case KV_KEY_LEFT:
    case ',': *out = act(KV_ACT_TAB_PREV, 0); return 1;
    case KV_KEY_RIGHT:
    case '.': *out = act(KV_ACT_TAB_NEXT, 0); return 1;
    case 'n': *out = act(KV_ACT_TAB_NEW, 0); return 1;
    case 'w': *out = act(KV_ACT_TAB_CLOSE, 0); return 1;
    case 'r': *out = act(KV_ACT_TAB_RENAME, 0); return 1;
    case 'p': *out = act(KV_ACT_PAUSE, 0); return 1;
    case 's': *out = act(KV_ACT_STEP, 0); return 1;
    case 'm': *out = act(KV_ACT_SLOW, 0); return 1;
    case 'l': *out = act(KV_ACT_LOAD, 0); return 1;
    case 'z': *out = act(KV_ACT_ZOOM_NEXT, 0); return 1;
    case 'k': *out = act(KV_ACT_RECORD, 0); return 1;
    case 'q': *out = act(KV_ACT_QUIT, 0); return 1;
    case KV_KEY_PGUP: *out = act(KV_ACT_LOG_SCROLL, page); return 1;
    case KV_KEY_PGDN: *out = act(KV_ACT_LOG_SCROLL, -page); return 1;
    default: return 0;
    }
}

kv_action kv_keys_map(kv_key k, const kv_key_ctx *c) {
    kv_key_ctx dflt = {KV_FOCUS_INPUT, 1, 0, 0, 0, 10};
    if (!c) c = &dflt;
    int page = c->page > 0 ? c->page : 10;
    kv_action a = act(KV_ACT_NONE, 0);
    /* The help overlay takes the next key to close itself, except the keys
     * that must always work. */
    if (c->help_shown) {
        if (!k.alt && (k.code == KV_KEY_CTRL('c') || k.code == KV_KEY_F(10) || k.code == KV_KEY_RESIZE ||
                       k.code == KV_KEY_CTRL('z')))
            return global_key(k, c, &a), a;
        return act(KV_ACT_HELP, 0);
    }
    if (global_key(k, c, &a)) return a;
    /* Unbound Alt keys (M-b, M-f, M-d, M-Enter for a new line, ...) are
     * readline's in the input; nothing in the panels. */
    if (k.alt) return c->focus == KV_FOCUS_INPUT ? act(KV_ACT_INPUT, 0) : act(KV_ACT_NONE, 0);

    if (c->focus == KV_FOCUS_INPUT) {
        switch (k.code) {
        case KV_KEY_PGUP: return act(KV_ACT_SCROLL, page);
        case KV_KEY_PGDN: return act(KV_ACT_SCROLL, -page);
        case KV_KEY_CTRL('d'):
            /* readline's end-of-file: quit only from an empty line, else delete-char. */
            return c->input_empty ? act(KV_ACT_QUIT, 0) : act(KV_ACT_INPUT, 0);
        case '?':
            return c->input_empty ? act(KV_ACT_HELP, 0) : act(KV_ACT_INPUT, 0);
        default: return act(KV_ACT_INPUT, 0);
        }
    }
    /* Panel focus: htop-style single keys. */
    if (k.code >= '1' && k.code <= '9') return act(KV_ACT_TAB_GOTO, k.code - '1');
    switch (k.code) {
    case 'q': return act(KV_ACT_QUIT, 0);
    case '?':
    case 'h': return act(KV_ACT_HELP, 0);
    case 'p':
    case ' ': return act(KV_ACT_PAUSE, 0);
    case 's':
    case '.': return act(KV_ACT_STEP, 0);
    case 'm': return act(KV_ACT_SLOW, 0);
    case 'l': return act(KV_ACT_LOAD, 0);
    case 'z': return act(KV_ACT_ZOOM_NEXT, 0);
    case 'Z':
    case '0': return act(KV_ACT_ZOOM_OFF, 0);
    case 'n': return act(KV_ACT_TAB_NEW, 0);
    case 'w': return act(KV_ACT_TAB_CLOSE, 0);
    case 'r': return act(KV_ACT_TAB_RENAME, 0);
    case 'c': return act(KV_ACT_CANCEL, 0);
    case 'k': return act(KV_ACT_RECORD, 0);
    case 't': return act(KV_ACT_THEME, 0);
    case KV_KEY_LEFT: return act(KV_ACT_TAB_PREV, 0);
    case KV_KEY_RIGHT: return act(KV_ACT_TAB_NEXT, 0);
    case KV_KEY_UP: return act(KV_ACT_LOG_SCROLL, 1);
    case KV_KEY_DOWN: return act(KV_ACT_LOG_SCROLL, -1);
    case KV_KEY_PGUP: return act(KV_ACT_LOG_SCROLL, page);
    case KV_KEY_PGDN: return act(KV_ACT_LOG_SCROLL, -page);
    case KV_KEY_END: return act(KV_ACT_LOG_END, 0);
    case KV_KEY_HOME: return act(KV_ACT_SCROLL_END, 0);
    case 'i':
    case KV_KEY_ENTER:
    case '\r':
    case '\n': return act(KV_ACT_FOCUS_INPUT, 0);
    default: return act(KV_ACT_NONE, 0);
    }
}

const kv_key_help *kv_keys_help(void) {
    /* [x]: the single key that does it in panel focus. */
    static const kv_key_help h[] = {
        {"Enter", "send (Alt-Enter or a trailing \\ starts a new line)"},
        {"Tab", "focus: input line <-> panels (panel keys in [ ])"},
        {"Esc", "cancel the reply in flight / unzoom / back to input"},
        {"F1  ? [?]", "this help (? on an empty input line)"},
        {"F2  M-p [p]", "pause / resume the engine"},
        {"F3  M-s [s]", "single step: one engine iteration (pauses first)"},
        {"F4  M-m [m]", "slow motion: 0, 50, 200, 500, 1000 ms per step"},
        {"F5  M-l [l]", "inject / stop background load (profile workload)"},
        {"F6  M-z [z]", "zoom the next panel ([0] or Esc unzooms)"},
        {"F7  M-k [k]", "record a trace / stop (kvtop replay FILE)"},
        {"F8  [t]", "colors on / off (8 colors or monochrome)"},
        {"F9", "block map: each block's fill (blank ▁▃▅█) / its owner's glyph"},
        {"[ ] (panel keys)", "kvtop attach on several URLs: previous / next engine in the panels"},
        {"M-1..9 [1..9]", "switch tab; M-Left/Right [Left/Right] prev/next"},
        {"M-n M-w M-r", "new, close, rename tab ([n] [w] [r])"},
        {"PgUp/PgDn wheel", "scroll the transcript; [Up/Down/PgUp/PgDn] step log"},
        {"Ctrl-R", "search this tab's input history (Up/Down recall)"},
        {"Ctrl-Z", "suspend to the shell (fg resumes; the engine stops too)"},
        {"Ctrl-C F10 M-q [q]", "quit (also Ctrl-D on an empty input line)"},
        {NULL, NULL},
    };
    return h;
}

const kv_key_help *kv_commands_help(void) {
    static const kv_key_help h[] = {
        {"/new [NAME] /close", "open a tab / close this one (/rename NAME)"},
        {"/system TEXT", "this tab's system prompt (/system alone removes it)"},
        {"/temp /topp /topk", "this tab's sampling: T, P, K (/seed N, /settings)"},
        {"/max N", "reply length limit in tokens"},
        {"/clear  /save FILE", "forget the conversation / write it as Markdown"},
        {"/load PROFILE", "restart the engine on another profile"},
        {"/pause /step [N]", "engine controls (/slow MS: slow motion)"},
        {"/inject [N]", "N background sessions from the workload (0 stops)"},
        {"/record [F] /export F", "trace recording; Chrome trace JSON of it"},
        {"/zoom PANEL|off", "kv prefix spec tpot mem sched log chat"},
        {"/tab N /cancel", "switch tab; cancel the reply (/help, /quit)"},
        {"//text", "send text that starts with '/'"},
        {NULL, NULL},
    };
    return h;
}

/* ---- slash commands ---- */

static const struct {
    const char *name;
    kv_cmd_kind kind;
} cmd_names[] = {
    {"new", KV_CMD_NEW},       {"close", KV_CMD_CLOSE},   {"rename", KV_CMD_RENAME}, {"system", KV_CMD_SYSTEM},
    {"temp", KV_CMD_TEMP},     {"topp", KV_CMD_TOPP},     {"topk", KV_CMD_TOPK},     {"max", KV_CMD_MAX},
    {"seed", KV_CMD_SEED},     {"clear", KV_CMD_CLEAR},   {"save", KV_CMD_SAVE},     {"load", KV_CMD_LOAD},
    {"help", KV_CMD_HELP},     {"quit", KV_CMD_QUIT},     {"exit", KV_CMD_QUIT},     {"pause", KV_CMD_PAUSE},
    {"step", KV_CMD_STEP},     {"slow", KV_CMD_SLOW},     {"inject", KV_CMD_INJECT}, {"record", KV_CMD_RECORD},
    {"export", KV_CMD_EXPORT}, {"zoom", KV_CMD_ZOOM},     {"tab", KV_CMD_TAB},       {"cancel", KV_CMD_CANCEL},
    {"settings", KV_CMD_SETTINGS},
};

static const char *zoom_names[KV_PANEL_COUNT] = {"chat", "kv", "prefix", "spec", "tpot", "mem", "sched", "log"};

/* Parses a whole-string number in [lo, hi]; integer when want_int. */
static int parse_num(const char *s, double lo, double hi, int want_int, double *out) {
    if (!*s) return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) return -1;
    if (want_int && v != floor(v)) return -1;
    *out = v;
    return 0;
}

int kv_command_parse(const char *line, kv_command *out, char *msg, size_t cap) {
    if (msg && cap) msg[0] = 0;
    if (!line || !out) {
        if (msg) snprintf(msg, cap, "no input");
        return -1;
    }
    kv_command c;
    memset(&c, 0, sizeof c);
    if (line[0] != '/' || line[1] == '/') {
        /* A prompt; "//text" sends "/text". */
        c.prompt = line[0] == '/' ? line + 1 : line;
        *out = c;
        return 0;
    }
    /* Command word. */
    const char *p = line + 1;
    size_t wl = 0;
    while (p[wl] && !isspace((unsigned char)p[wl])) wl++;
    const char *a = p + wl;
    while (*a && isspace((unsigned char)*a)) a++;
    size_t al = strlen(a);
    while (al > 0 && isspace((unsigned char)a[al - 1])) al--;
    if (al >= sizeof c.arg) {
        if (msg) snprintf(msg, cap, "/%.*s: argument too long", (int)wl, p);
        return -1;
    }
    memcpy(c.arg, a, al);
    c.arg[al] = 0;
    int found = 0;
    for (size_t i = 0; i < sizeof cmd_names / sizeof cmd_names[0]; i++)
        if (strlen(cmd_names[i].name) == wl && !strncmp(cmd_names[i].name, p, wl)) {
            c.kind = cmd_names[i].kind;
            found = 1;
        }
    if (!found) {
        if (msg) snprintf(msg, cap, "unknown command /%.*s (try /help)", (int)(wl > 40 ? 40 : wl), p);
        return -1;
    }
    const char *name = NULL;
    for (size_t i = 0; i < sizeof cmd_names / sizeof cmd_names[0]; i++)
        if (cmd_names[i].kind == c.kind) {
            name = cmd_names[i].name;
            break;
        }
#define NEED_NUM(lo, hi, isint, what)                                                          \
    do {                                                                                       \
        if (parse_num(c.arg, lo, hi, isint, &c.num)) {                                         \
            if (msg) snprintf(msg, cap, "/%s needs %s", name, what);                           \
            return -1;                                                                         \
        }                                                                                      \
        c.has_num = 1;                                                                         \
    } while (0)
    switch (c.kind) {
    case KV_CMD_TEMP: NEED_NUM(0, 5, 0, "a temperature in [0, 5]"); break;
    case KV_CMD_TOPP:
        NEED_NUM(0, 1, 0, "a probability in (0, 1]");
        if (c.num <= 0) {
            if (msg) snprintf(msg, cap, "/topp needs a probability in (0, 1]");
            return -1;
        }
        break;
    case KV_CMD_TOPK: NEED_NUM(0, 1 << 20, 1, "an integer in [0, 1048576]"); break;
    case KV_CMD_MAX: NEED_NUM(1, 1 << 20, 1, "a token count in [1, 1048576]"); break;
    case KV_CMD_SEED: NEED_NUM(0, 9007199254740992.0, 1, "a non-negative integer"); break;
    case KV_CMD_SLOW: NEED_NUM(0, 10000, 1, "milliseconds per step in [0, 10000]"); break;
    case KV_CMD_TAB: NEED_NUM(1, 99, 1, "a tab number from 1"); break;
    case KV_CMD_STEP:
        if (c.arg[0]) NEED_NUM(1, 10000, 1, "a step count in [1, 10000]");
        break;
    case KV_CMD_INJECT:
        if (c.arg[0]) NEED_NUM(0, 256, 1, "a session count in [0, 256]");
        break;
    case KV_CMD_RENAME:
        if (!c.arg[0] || strlen(c.arg) > 24) {
            if (msg) snprintf(msg, cap, "/rename needs a name of 1 to 24 bytes");
            return -1;
        }
        break;
    case KV_CMD_NEW:
        if (strlen(c.arg) > 24) {
            if (msg) snprintf(msg, cap, "/new: a tab name is at most 24 bytes");
            return -1;
        }
        break;
    case KV_CMD_SAVE:
    case KV_CMD_LOAD:
    case KV_CMD_EXPORT:
        if (!c.arg[0]) {
            if (msg)
                snprintf(msg, cap, "/%s needs a %s", name, c.kind == KV_CMD_LOAD ? "profile path" : "file name");
            return -1;
        }
        break;
    case KV_CMD_ZOOM: {
        int z = -2;
        if (!c.arg[0] || !strcmp(c.arg, "off") || !strcmp(c.arg, "none")) z = -1;
        for (int i = 0; i < KV_PANEL_COUNT; i++)
            if (!strcmp(c.arg, zoom_names[i])) z = i;
        if (z == -2) {
            if (msg) snprintf(msg, cap, "/zoom needs one of: off chat kv prefix spec tpot mem sched log");
            return -1;
        }
        c.num = z;
        c.has_num = 1;
        break;
    }
    case KV_CMD_CLOSE:
    case KV_CMD_CLEAR:
    case KV_CMD_HELP:
    case KV_CMD_QUIT:
    case KV_CMD_PAUSE:
    case KV_CMD_CANCEL:
    case KV_CMD_SETTINGS:
        if (c.arg[0]) {
            if (msg) snprintf(msg, cap, "/%s takes no argument", name);
            return -1;
        }
        break;
    default: break;
    }
#undef NEED_NUM
    *out = c;
    return 0;
}
