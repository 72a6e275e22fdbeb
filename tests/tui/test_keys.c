/* test_keys.c - key bindings per focus and input state, and slash-command
 * parsing with its error messages. */
#include <string.h>

#include "../harness.h"
#include "../../tui/keys.h"
#include "../../tui/layout.h"

static kv_key key(int code) {
    kv_key k = {code, 0};
    return k;
}
static kv_key alt(int code) {
    kv_key k = {code, 1};
    return k;
}
static kv_key_ctx input_ctx(int empty) {
    kv_key_ctx c = {KV_FOCUS_INPUT, empty, 0, 0, 0, 10};
    return c;
}
static kv_key_ctx panel_ctx(void) {
    kv_key_ctx c = {KV_FOCUS_PANELS, 1, 0, 0, 0, 10};
    return c;
}

static void test_typing_goes_to_input(void) {
    kv_key_ctx c = input_ctx(1);
    /* Letters that are commands in panel focus are text in the input. */
    const char *s = "qpszlmnwrhct0123 ";
    for (const char *p = s; *p; p++) CHECKF(kv_keys_map(key(*p), &c).type == KV_ACT_INPUT, "'%c'", *p);
    CHECK(kv_keys_map(key(0x4e2d), &c).type == KV_ACT_INPUT); /* non-ASCII */
    CHECK(kv_keys_map(key(KV_KEY_LEFT), &c).type == KV_ACT_INPUT);
    CHECK(kv_keys_map(key(KV_KEY_ENTER), &c).type == KV_ACT_INPUT);
    CHECK(kv_keys_map(key(KV_KEY_CTRL('r')), &c).type == KV_ACT_INPUT); /* history search */
    CHECK(kv_keys_map(key(KV_KEY_CTRL('a')), &c).type == KV_ACT_INPUT);
    /* '?' opens help only on an empty line. */
    CHECK(kv_keys_map(key('?'), &c).type == KV_ACT_HELP);
    c.input_empty = 0;
    CHECK(kv_keys_map(key('?'), &c).type == KV_ACT_INPUT);
}

static void test_quit_keys(void) {
    kv_key_ctx in = input_ctx(1), busy = input_ctx(0), pn = panel_ctx();
    CHECK(kv_keys_map(key(KV_KEY_CTRL('c')), &in).type == KV_ACT_QUIT);
    CHECK(kv_keys_map(key(KV_KEY_CTRL('c')), &busy).type == KV_ACT_QUIT);
    CHECK(kv_keys_map(key(KV_KEY_F(10)), &busy).type == KV_ACT_QUIT);
    CHECK(kv_keys_map(alt('q'), &busy).type == KV_ACT_QUIT);
    CHECK(kv_keys_map(key('q'), &pn).type == KV_ACT_QUIT);
    CHECK(kv_keys_map(key('q'), &in).type == KV_ACT_INPUT);
    /* Ctrl-D: quit from an empty line, delete-char otherwise. */
    CHECK(kv_keys_map(key(KV_KEY_CTRL('d')), &in).type == KV_ACT_QUIT);
    CHECK(kv_keys_map(key(KV_KEY_CTRL('d')), &busy).type == KV_ACT_INPUT);
}

/* Ctrl-Z suspends from either focus, even over the help overlay, and the
 * help says so (it used to go to readline and do nothing). */
static void test_suspend_key(void) {
    kv_key_ctx in = input_ctx(0), pn = panel_ctx(), help = input_ctx(1);
    help.help_shown = 1;
    CHECK(kv_keys_map(key(KV_KEY_CTRL('z')), &in).type == KV_ACT_SUSPEND);
    CHECK(kv_keys_map(key(KV_KEY_CTRL('z')), &pn).type == KV_ACT_SUSPEND);
    CHECK(kv_keys_map(key(KV_KEY_CTRL('z')), &help).type == KV_ACT_SUSPEND);
    const kv_key_help *h = kv_keys_help();
    int listed = 0;
    for (int i = 0; h[i].keys; i++) listed |= !strcmp(h[i].keys, "Ctrl-Z") && strstr(h[i].what, "suspend");
    CHECK(listed);
}

static void test_esc(void) {
    kv_key_ctx c = input_ctx(0);
    c.reply_in_flight = 1;
    CHECK(kv_keys_map(key(KV_KEY_ESC), &c).type == KV_ACT_CANCEL);
    c.reply_in_flight = 0;
    c.zoomed = 1;
    CHECK(kv_keys_map(key(KV_KEY_ESC), &c).type == KV_ACT_ZOOM_OFF);
    c.zoomed = 0;
    CHECK(kv_keys_map(key(KV_KEY_ESC), &c).type == KV_ACT_NONE);
    kv_key_ctx p = panel_ctx();
    CHECK(kv_keys_map(key(KV_KEY_ESC), &p).type == KV_ACT_FOCUS_INPUT);
}

static void test_function_and_alt_keys(void) {
    kv_key_ctx c = input_ctx(0);
    CHECK(kv_keys_map(key(KV_KEY_F(1)), &c).type == KV_ACT_HELP);
    CHECK(kv_keys_map(key(KV_KEY_F(2)), &c).type == KV_ACT_PAUSE);
    CHECK(kv_keys_map(key(KV_KEY_F(3)), &c).type == KV_ACT_STEP);
    CHECK(kv_keys_map(key(KV_KEY_F(4)), &c).type == KV_ACT_SLOW);
    CHECK(kv_keys_map(key(KV_KEY_F(5)), &c).type == KV_ACT_LOAD);
    CHECK(kv_keys_map(key(KV_KEY_F(6)), &c).type == KV_ACT_ZOOM_NEXT);
    CHECK(kv_keys_map(alt('p'), &c).type == KV_ACT_PAUSE);
    CHECK(kv_keys_map(alt('s'), &c).type == KV_ACT_STEP);
    kv_action a = kv_keys_map(alt('3'), &c);
    CHECK(a.type == KV_ACT_TAB_GOTO && a.arg == 2);
    CHECK(kv_keys_map(alt(KV_KEY_RIGHT), &c).type == KV_ACT_TAB_NEXT);
    CHECK(kv_keys_map(alt('n'), &c).type == KV_ACT_TAB_NEW);
    /* readline keeps its word motions. */
    CHECK(kv_keys_map(alt('b'), &c).type == KV_ACT_INPUT);
    CHECK(kv_keys_map(alt(KV_KEY_ENTER), &c).type == KV_ACT_INPUT); /* new line */
    kv_key_ctx p = panel_ctx();
    CHECK(kv_keys_map(alt('b'), &p).type == KV_ACT_NONE);
    CHECK(kv_keys_map(key(KV_KEY_TAB), &c).type == KV_ACT_FOCUS_TOGGLE);
    a = kv_keys_map(key(KV_KEY_PGUP), &c);
    CHECK(a.type == KV_ACT_SCROLL && a.arg == 10);
    a = kv_keys_map(key(KV_KEY_WHEEL_DOWN), &c);
    CHECK(a.type == KV_ACT_SCROLL && a.arg < 0);
}

static void test_panel_focus(void) {
    kv_key_ctx p = panel_ctx();
    CHECK(kv_keys_map(key('p'), &p).type == KV_ACT_PAUSE);
    CHECK(kv_keys_map(key(' '), &p).type == KV_ACT_PAUSE);
    CHECK(kv_keys_map(key('s'), &p).type == KV_ACT_STEP);
    CHECK(kv_keys_map(key('z'), &p).type == KV_ACT_ZOOM_NEXT);
    CHECK(kv_keys_map(key('l'), &p).type == KV_ACT_LOAD);
    CHECK(kv_keys_map(key('?'), &p).type == KV_ACT_HELP);
    kv_action a = kv_keys_map(key('2'), &p);
    CHECK(a.type == KV_ACT_TAB_GOTO && a.arg == 1);
    a = kv_keys_map(key(KV_KEY_UP), &p);
    CHECK(a.type == KV_ACT_LOG_SCROLL && a.arg == 1);
    CHECK(kv_keys_map(key(KV_KEY_ENTER), &p).type == KV_ACT_FOCUS_INPUT);
    CHECK(kv_keys_map(key('x'), &p).type == KV_ACT_NONE); /* unbound: nothing, never text */
}

static void test_help_overlay_swallows_keys(void) {
    kv_key_ctx c = input_ctx(1);
    c.help_shown = 1;
    CHECK(kv_keys_map(key('a'), &c).type == KV_ACT_HELP); /* closes it */
    CHECK(kv_keys_map(key(KV_KEY_CTRL('c')), &c).type == KV_ACT_QUIT);
    CHECK(kv_keys_map(key(KV_KEY_RESIZE), &c).type == KV_ACT_RESIZE);
    const kv_key_help *h = kv_keys_help();
    int n = 0, has_quit = 0;
    for (; h[n].keys; n++) has_quit |= strstr(h[n].what, "quit") != NULL;
    CHECK(n > 10 && has_quit);
}

static void test_parse_prompts(void) {
    kv_command c;
    char msg[128];
    CHECK(kv_command_parse("Once upon a time", &c, msg, sizeof msg) == 0);
    CHECK(c.kind == KV_CMD_NONE && !strcmp(c.prompt, "Once upon a time"));
    CHECK(kv_command_parse("//etc/passwd is a path", &c, msg, sizeof msg) == 0);
    CHECK(c.kind == KV_CMD_NONE && !strcmp(c.prompt, "/etc/passwd is a path"));
    /* Long prompts are fine (they are not copied). */
    static char big[10000];
    memset(big, 'x', sizeof big - 1);
    CHECK(kv_command_parse(big, &c, msg, sizeof msg) == 0 && c.prompt == big);
}

static void test_parse_commands(void) {
    kv_command c;
    char msg[128];
    CHECK(kv_command_parse("/temp 0.7", &c, msg, sizeof msg) == 0 && c.kind == KV_CMD_TEMP && c.num == 0.7);
    CHECK(kv_command_parse("/max  64 ", &c, msg, sizeof msg) == 0 && c.kind == KV_CMD_MAX && c.num == 64);
    CHECK(kv_command_parse("/system You are terse.", &c, msg, sizeof msg) == 0 && c.kind == KV_CMD_SYSTEM &&
          !strcmp(c.arg, "You are terse."));
    CHECK(kv_command_parse("/system", &c, msg, sizeof msg) == 0 && c.kind == KV_CMD_SYSTEM && c.arg[0] == 0);
    CHECK(kv_command_parse("/new", &c, msg, sizeof msg) == 0 && c.kind == KV_CMD_NEW && !c.arg[0]);
    CHECK(kv_command_parse("/new stories", &c, msg, sizeof msg) == 0 && !strcmp(c.arg, "stories"));
    CHECK(kv_command_parse("/save /tmp/t.md", &c, msg, sizeof msg) == 0 && c.kind == KV_CMD_SAVE);
    CHECK(kv_command_parse("/load profiles/x.yaml", &c, msg, sizeof msg) == 0 && c.kind == KV_CMD_LOAD);
    CHECK(kv_command_parse("/zoom kv", &c, msg, sizeof msg) == 0 && c.kind == KV_CMD_ZOOM && c.num == KV_PANEL_BLOCKS);
    CHECK(kv_command_parse("/zoom off", &c, msg, sizeof msg) == 0 && c.num == -1);
    CHECK(kv_command_parse("/step", &c, msg, sizeof msg) == 0 && c.kind == KV_CMD_STEP && !c.has_num);
    CHECK(kv_command_parse("/step 5", &c, msg, sizeof msg) == 0 && c.has_num && c.num == 5);
    CHECK(kv_command_parse("/inject 0", &c, msg, sizeof msg) == 0 && c.kind == KV_CMD_INJECT && c.num == 0);
    CHECK(kv_command_parse("/exit", &c, msg, sizeof msg) == 0 && c.kind == KV_CMD_QUIT);
}

static void test_parse_errors(void) {
    kv_command c;
    memset(&c, 0, sizeof c);
    c.kind = KV_CMD_HELP;
    char msg[128];
    struct {
        const char *line, *want;
    } bad[] = {
        {"/temp", "/temp needs a temperature"},      {"/temp hot", "/temp needs"},
        {"/temp 9", "/temp needs"},                  {"/temp nan", "/temp needs"},
        {"/topp 0", "/topp needs"},                  {"/topp 1.5", "/topp needs"},
        {"/max 0", "/max needs a token count"},      {"/max 2.5", "/max needs"},
        {"/max 12abc", "/max needs"},                {"/save", "/save needs a file name"},
        {"/load", "/load needs a profile path"},     {"/frobnicate", "unknown command /frobnicate"},
        {"/zoom sideways", "/zoom needs one of"},    {"/rename", "/rename needs a name"},
        {"/clear now", "/clear takes no argument"},  {"/slow -5", "/slow needs"},
        {"/tab 0", "/tab needs"},                    {"/rename aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "/rename needs"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECKF(kv_command_parse(bad[i].line, &c, msg, sizeof msg) == -1, "%s", bad[i].line);
        CHECKF(strstr(msg, bad[i].want) != NULL, "%s -> %s", bad[i].line, msg);
        CHECK(c.kind == KV_CMD_HELP); /* untouched */
    }
    CHECK(kv_command_parse(NULL, &c, msg, sizeof msg) == -1);
    /* A tiny message buffer is still terminated. */
    char tiny[4];
    CHECK(kv_command_parse("/temp", &c, tiny, sizeof tiny) == -1 && strlen(tiny) == 3);
}

TEST_MAIN(T(test_typing_goes_to_input), T(test_quit_keys), T(test_esc), T(test_function_and_alt_keys),
          T(test_panel_focus), T(test_help_overlay_swallows_keys), T(test_suspend_key), T(test_parse_prompts),
          T(test_parse_commands), T(test_parse_errors))
