/* test_input.c - readline in callback mode fed key by key, as the TUI does:
 * editing, lines delivered to the handler, per-session history with Up and
 * Ctrl-R, drafts kept across tab switches, Alt-Enter multi-line, UTF-8. */
#include <stdlib.h>
#include <string.h>

#include "../harness.h"
#include "../../tui/input.h"

/* readline keeps its kill ring and a few strings for the process lifetime. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libreadline.so\n"; }

static char got[16][256];
static int n_got;
/* Two sessions' history slots for the switch-inside-the-handler case. */
static void *slot_a, *slot_b;
static char *draft_a, *draft_b;

static void on_line(char *line, void *ctx) {
    (void)ctx;
    if (line && n_got < 16) {
        snprintf(got[n_got++], sizeof got[0], "%s", line);
        kv_input_history_add(line);
        /* What "/new" does in the app: switch tabs from inside the handler. */
        if (!strcmp(line, "/switch")) kv_input_history_switch(&slot_a, &draft_a, &slot_b, NULL);
    }
    free(line);
}

static void type(const char *s) {
    for (const char *p = s; *p; p++) {
        kv_key k = {(unsigned char)*p, 0};
        kv_input_feed(k);
    }
}
static void key(int code) {
    kv_key k = {code, 0};
    kv_input_feed(k);
}
static const char *buffer(void) {
    kv_input_view v;
    kv_input_view_get(&v);
    return v.text;
}

static void test_all(void) {
    REQUIRE(kv_input_init(on_line, NULL) == 0);
    CHECK(kv_input_empty());
    type("helo");
    key(KV_KEY_LEFT);
    type("l");
    CHECK(!strcmp(buffer(), "hello"));
    kv_input_view v;
    kv_input_view_get(&v);
    CHECK(v.point == 4 && !v.searching);
    key(KV_KEY_END);
    key(KV_KEY_BACKSPACE);
    key(KV_KEY_ENTER);
    CHECK(n_got == 1 && !strcmp(got[0], "hell"));
    CHECK(kv_input_empty());
    type("second");
    key(KV_KEY_ENTER);
    /* Up recalls, Ctrl-R finds. */
    key(KV_KEY_UP);
    CHECK(!strcmp(buffer(), "second"));
    key(KV_KEY_CTRL('u'));
    key(KV_KEY_CTRL('a'));
    key(KV_KEY_CTRL('k'));
    CHECK(kv_input_empty());
    key(KV_KEY_CTRL('r'));
    type("hel");
    kv_input_view_get(&v);
    CHECK(v.searching && strstr(v.prompt, "hel") != NULL);
    CHECK(!strcmp(v.text, "hell"));
    key(KV_KEY_ENTER);
    CHECK(n_got == 3 && !strcmp(got[2], "hell"));

    /* A second session: its own empty history; the draft of the first is kept. */
    void *h1 = NULL, *h2 = kv_input_history_new();
    char *d1 = NULL, *d2 = NULL;
    type("draft one");
    kv_input_history_switch(&h1, &d1, &h2, NULL);
    CHECK(h2 == NULL && h1 != NULL);
    CHECK(kv_input_empty() && d1 && !strcmp(d1, "draft one"));
    key(KV_KEY_UP);
    CHECK(kv_input_empty()); /* nothing to recall here */
    type("other");
    key(KV_KEY_ENTER);
    CHECK(!strcmp(got[3], "other"));
    kv_input_history_switch(&h2, &d2, &h1, d1);
    CHECK(!strcmp(buffer(), "draft one"));
    key(KV_KEY_CTRL('a'));
    key(KV_KEY_CTRL('k'));
    key(KV_KEY_UP);
    CHECK(!strcmp(buffer(), "hell")); /* session 1's history, not "other" */
    key(KV_KEY_CTRL('a'));
    key(KV_KEY_CTRL('k'));

    /* Alt-Enter inserts a new line; Enter sends both lines. */
    type("line one");
    kv_key ae = {KV_KEY_ENTER, 1};
    kv_input_feed(ae);
    type("line two");
    key(KV_KEY_ENTER);
    CHECK(!strcmp(got[4], "line one\nline two"));

    /* UTF-8 code points arrive whole. */
    key(0xe9);
    key(0x4e2d);
    key(KV_KEY_ENTER);
    CHECK(!strcmp(got[5], "\xc3\xa9\xe4\xb8\xad"));
    /* A surrogate has no UTF-8 (base/utf8.h's encoder says so): the key
     * inserts nothing; U+10FFFF, the last code point, arrives whole. */
    key(0xD800);
    key(0xDFFF);
    key(0x10FFFF);
    key(KV_KEY_ENTER);
    CHECKF(!strcmp(got[6], "\xf4\x8f\xbf\xbf"), "%s", got[6]);

    /* set_text prefills. */
    kv_input_set_text("/rename ");
    type("x");
    CHECK(!strcmp(buffer(), "/rename x"));
    kv_input_history_free(h2);
    free(d1);
    free(d2);
    key(KV_KEY_CTRL('a'));
    key(KV_KEY_CTRL('k'));

    /* Switching inside the line handler: the accepted line is history of
     * the old tab, not a draft, and typing continues on an empty line. */
    slot_b = kv_input_history_new();
    type("/switch");
    key(KV_KEY_ENTER);
    CHECK(draft_a == NULL && slot_a != NULL && slot_b == NULL);
    CHECK(kv_input_empty());
    type("The cat sat");
    CHECK(!strcmp(buffer(), "The cat sat"));
    key(KV_KEY_ENTER);
    CHECK(!strcmp(got[n_got - 1], "The cat sat"));
    kv_input_history_switch(&slot_b, &draft_b, &slot_a, draft_a);
    key(KV_KEY_UP);
    CHECK(!strcmp(buffer(), "/switch"));
    kv_input_history_free(slot_b);
    free(draft_b);
    kv_input_shutdown();
}

TEST_MAIN(T(test_all))
