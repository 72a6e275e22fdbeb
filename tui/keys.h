/* keys.h - what a key or an input line means in the TUI, as pure functions:
 * a key plus the focus and the input state map to an action, and a line
 * starting with '/' parses into a slash command. The app executes the
 * result; tests/tui/test_keys.c checks the mapping without a terminal.
 *
 * Focus: keys go to the input line (readline) by default; Tab moves them to
 * the panels, where single letters are commands (q quits, p pauses, ...).
 * NOTE: q does not quit from the input line even when it is empty, so a
 * prompt may start with "q"; Ctrl-C, F10 and Ctrl-D on an empty line do. */
#ifndef KV_TUI_KEYS_H
#define KV_TUI_KEYS_H

#include <stddef.h>

/* Keys: a Unicode code point (>= 0), or one of these. */
enum {
    KV_KEY_BASE = 0x110000, /* above every code point */
    KV_KEY_F1 = KV_KEY_BASE + 1, /* .. KV_KEY_F1 + 11 is F12 */
    KV_KEY_UP = KV_KEY_BASE + 20,
    KV_KEY_DOWN,
    KV_KEY_LEFT,
    KV_KEY_RIGHT,
    KV_KEY_PGUP,
    KV_KEY_PGDN,
    KV_KEY_HOME,
    KV_KEY_END,
    KV_KEY_BACKSPACE,
    KV_KEY_DELETE,
    KV_KEY_ENTER,
    KV_KEY_TAB,
    KV_KEY_BTAB,
    KV_KEY_ESC,
    KV_KEY_RESIZE,
    KV_KEY_WHEEL_UP,
    KV_KEY_WHEEL_DOWN,
    KV_KEY_INSERT,
    KV_KEY_OTHER /* a special key the app has no use for */
};
#define KV_KEY_F(n) (KV_KEY_F1 + (n) - 1)
#define KV_KEY_CTRL(c) ((c) & 0x1f)

typedef struct kv_key {
    int code; /* code point or KV_KEY_* */
    int alt;  /* bool: pressed with Alt (sent as ESC + key) */
} kv_key;

typedef enum kv_focus { KV_FOCUS_INPUT = 0, KV_FOCUS_PANELS = 1 } kv_focus;

typedef enum kv_action_type {
    KV_ACT_NONE = 0,
    KV_ACT_INPUT,        /* give the key to the input line */
    KV_ACT_QUIT,
    KV_ACT_HELP,         /* toggle the help overlay */
    KV_ACT_CANCEL,       /* cancel the selected session's reply in flight */
    KV_ACT_FOCUS_TOGGLE,
    KV_ACT_FOCUS_INPUT,
    KV_ACT_PAUSE,        /* pause / resume the engine */
    KV_ACT_STEP,         /* one engine step (pauses first) */
    KV_ACT_SLOW,         /* next slow-motion delay */
    KV_ACT_LOAD,         /* start / stop injected background load */
    KV_ACT_ZOOM_NEXT,    /* zoom the next panel (none -> first -> ... -> none) */
    KV_ACT_ZOOM_OFF,
    KV_ACT_TAB_NEXT,
    KV_ACT_TAB_PREV,
    KV_ACT_TAB_GOTO,     /* arg: tab index from 0 */
    KV_ACT_TAB_NEW,
    KV_ACT_TAB_CLOSE,
    KV_ACT_TAB_RENAME,   /* prefill the input with "/rename " */
    KV_ACT_SCROLL,       /* transcript: arg lines (+ up into history, - down) */
    KV_ACT_SCROLL_END,   /* transcript back to the newest line */
    KV_ACT_LOG_SCROLL,   /* step log: arg lines (+ older) */
    KV_ACT_LOG_END,
    KV_ACT_RECORD,       /* start / stop trace recording */
    KV_ACT_THEME,        /* cycle color / 8 colors / monochrome */
    KV_ACT_REDRAW,
    KV_ACT_RESIZE,
    KV_ACT_SUSPEND,      /* Ctrl-Z: back to the shell until fg */
    KV_ACT_FILL          /* F9: block map marks by fill / by owner */
} kv_action_type;

typedef struct kv_action {
    kv_action_type type;
    int arg;
} kv_action;

/* The input state the mapping depends on. */
typedef struct kv_key_ctx {
    kv_focus focus;
    int input_empty;     /* bool: the input line holds nothing */
    int reply_in_flight; /* bool: the selected session is generating */
    int zoomed;          /* bool: a panel is zoomed */
    int help_shown;      /* bool: the help overlay is up (any key closes it) */
    int page;            /* rows one PgUp/PgDn scrolls (>= 1) */
} kv_key_ctx;

kv_action kv_keys_map(kv_key key, const kv_key_ctx *ctx);

/* One line of help per binding, for the overlay: NULL-terminated array of
 * {keys, what} pairs. */
typedef struct kv_key_help {
    const char *keys;
    const char *what;
} kv_key_help;
const kv_key_help *kv_keys_help(void);

/* ---- slash commands ---- */

typedef enum kv_cmd_kind {
    KV_CMD_NONE = 0,  /* not a command: a prompt (see kv_command.prompt) */
    KV_CMD_NEW,       /* /new [NAME] */
    KV_CMD_CLOSE,     /* /close */
    KV_CMD_RENAME,    /* /rename NAME */
    KV_CMD_SYSTEM,    /* /system TEXT (empty: no system prompt) */
    KV_CMD_TEMP,      /* /temp T */
    KV_CMD_TOPP,      /* /topp P */
    KV_CMD_TOPK,      /* /topk K */
    KV_CMD_MAX,       /* /max N */
    KV_CMD_SEED,      /* /seed N */
    KV_CMD_CLEAR,     /* /clear */
    KV_CMD_SAVE,      /* /save FILE */
    KV_CMD_LOAD,      /* /load PROFILE */
    KV_CMD_HELP,      /* /help */
    KV_CMD_QUIT,      /* /quit */
    KV_CMD_PAUSE,     /* /pause (toggles) */
    KV_CMD_STEP,      /* /step [N] */
    KV_CMD_SLOW,      /* /slow MS */
    KV_CMD_INJECT,    /* /inject [N] (N background sessions, 0 stops; none: the profile's) */
    KV_CMD_RECORD,    /* /record [FILE] (no FILE: stop) */
    KV_CMD_EXPORT,    /* /export FILE.json (Chrome trace of the recording) */
    KV_CMD_ZOOM,      /* /zoom PANEL|off */
    KV_CMD_TAB,       /* /tab N (from 1) */
    KV_CMD_CANCEL,    /* /cancel */
    KV_CMD_SETTINGS   /* /settings: show the session's settings */
} kv_cmd_kind;

typedef struct kv_command {
    kv_cmd_kind kind;
    int has_num;    /* bool: num was given */
    double num;     /* numeric argument (validated for the command) */
    char arg[2048]; /* text argument (name, path, system prompt), trimmed */
    const char *prompt; /* KV_CMD_NONE: the prompt, pointing into the parsed line ("//x" -> "/x") */
} kv_command;

/* Parses one input line. Returns 0 with *out filled, or -1 with msg (cap
 * bytes) saying what was wrong ("/temp needs a number in [0, 5]") and *out
 * untouched. Lines not starting with '/' are prompts (KV_CMD_NONE). */
int kv_command_parse(const char *line, kv_command *out, char *msg, size_t cap);

/* Names of the slash commands with a one-line description (for /help and
 * completion); NULL-terminated. */
const kv_key_help *kv_commands_help(void);

#endif
