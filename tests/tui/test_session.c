/* test_session.c - chat session records: turns and streaming, messages for
 * the chat template (system prompt, notes and the open reply left out),
 * dropping old exchanges, Markdown export, the autosave log, and transcript
 * wrapping. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../harness.h"
#include "../../tui/session.h"

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static void test_turns_and_messages(void) {
    kv_session *s = kv_session_new(0, NULL, NULL, 0);
    REQUIRE(s);
    CHECK(!strcmp(s->name, "chat-1") && s->max_tokens == 128);
    CHECK(kv_session_set_system(s, "Be brief.") == 0);
    CHECK(kv_session_add(s, KV_ROLE_USER, "Hi") == 0);
    CHECK(kv_session_add(s, KV_ROLE_ASSISTANT, "") == 1);
    CHECK(kv_session_append(s, "Hel", 3) == 0 && kv_session_append(s, "lo!", 3) == 0);
    CHECK(!strcmp(kv_session_last(s)->text, "Hello!"));
    CHECK(kv_session_append_src(s, " ok", 3, 1) == 0);
    kv_turn *lt = kv_session_last(s);
    CHECK(lt->src[0] == 0 && lt->src[5] == 0 && lt->src[6] == 1 && lt->src[8] == 1 && lt->len == 9);
    lt->len = 6;
    lt->text[6] = 0;
    const char *roles[8], *texts[8];
    /* The reply still streaming is not part of the conversation sent. */
    int n = kv_session_messages(s, 0, roles, texts, 8);
    CHECK(n == 2 && !strcmp(roles[0], "system") && !strcmp(texts[1], "Hi"));
    kv_session_last(s)->finish = 1;
    kv_session_add(s, KV_ROLE_NOTE, "temperature 0.5");
    kv_session_add(s, KV_ROLE_USER, "More");
    n = kv_session_messages(s, 0, roles, texts, 8);
    CHECK(n == 4 && !strcmp(roles[2], "assistant") && !strcmp(texts[2], "Hello!") && !strcmp(texts[3], "More"));
    CHECK(kv_session_messages(s, 0, roles, texts, 3) == -1); /* too small */
    /* Dropping the oldest exchange starts at the second user turn. */
    int next = kv_session_next_exchange(s, 0);
    CHECK(next == 3);
    n = kv_session_messages(s, next, roles, texts, 8);
    CHECK(n == 2 && !strcmp(texts[1], "More"));
    CHECK(kv_session_next_exchange(s, next) == -1);
    /* A long streamed reply grows without loss. */
    kv_session_add(s, KV_ROLE_ASSISTANT, "");
    for (int i = 0; i < 1000; i++) CHECK(kv_session_append(s, "abcdefghij", 10) == 0);
    CHECK(kv_session_last(s)->len == 10000 && strlen(kv_session_last(s)->text) == 10000);
    kv_session_clear(s);
    CHECK(s->n_turns == 0 && kv_session_last(s) == NULL && kv_session_append(s, "x", 1) == -1);
    CHECK(kv_session_rename(s, "") == -1 && kv_session_rename(s, "stories") == 0 && !strcmp(s->name, "stories"));
    CHECK(kv_session_set_system(s, "") == 0 && s->system == NULL);
    kv_session_free(s);
    kv_session_free(NULL);
}

static void test_markdown_and_autosave(void) {
    char dir[] = "/tmp/kvtop-test-XXXXXX";
    REQUIRE(mkdtemp(dir));
    kv_session *s = kv_session_new(2, "story", NULL, 64);
    REQUIRE(s);
    char sub[512], msg[256];
    snprintf(sub, sizeof sub, "%s/state/kvtop", dir);
    CHECK(kv_session_autosave_open(s, sub, "20240101-000000", msg, sizeof msg) == 0);
    CHECK(strstr(s->autosave_path, "20240101-000000-3.md") != NULL);
    kv_session_add(s, KV_ROLE_USER, "Once upon a time");
    kv_session_autosave_turn(s, KV_ROLE_USER, "Once upon a time");
    /* The prompt is on disk before any reply arrives (nothing typed is lost). */
    char *on_disk = slurp(s->autosave_path);
    CHECK(on_disk && strstr(on_disk, "## You") && strstr(on_disk, "Once upon a time"));
    kv_session_add(s, KV_ROLE_ASSISTANT, "");
    kv_session_autosave_turn(s, KV_ROLE_ASSISTANT, "");
    kv_session_append(s, " there was", 10);
    kv_session_autosave_text(s, " there was", 10);
    kv_session_autosave_flush(s);
    on_disk = slurp(s->autosave_path);
    CHECK(on_disk && strstr(on_disk, "## Assistant\n\n there was"));
    char md[600];
    snprintf(md, sizeof md, "%s/t.md", dir);
    CHECK(kv_session_save_markdown(s, md, msg, sizeof msg) == 0);
    char *txt = slurp(md);
    CHECK(txt && !strncmp(txt, "# story\n", 8) && strstr(txt, "## You\n\nOnce upon a time\n") &&
          strstr(txt, "## Assistant\n\n there was"));
    /* An unwritable path is an error naming it. */
    CHECK(kv_session_save_markdown(s, "/nonexistent-dir/x.md", msg, sizeof msg) == -1 &&
          strstr(msg, "/nonexistent-dir/x.md"));
    unlink(md);
    unlink(s->autosave_path);
    kv_session_free(s);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

static void test_state_dir(void) {
    char buf[512];
    char *old_x = getenv("XDG_STATE_HOME") ? strdup(getenv("XDG_STATE_HOME")) : NULL;
    char *old_h = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
    setenv("XDG_STATE_HOME", "/x/state", 1);
    CHECK(kv_session_state_dir(buf, sizeof buf) == 0 && !strcmp(buf, "/x/state/kvtop"));
    unsetenv("XDG_STATE_HOME");
    setenv("HOME", "/home/u", 1);
    CHECK(kv_session_state_dir(buf, sizeof buf) == 0 && !strcmp(buf, "/home/u/.local/state/kvtop"));
    setenv("XDG_STATE_HOME", "relative", 1); /* ignored: the spec wants an absolute path */
    CHECK(kv_session_state_dir(buf, sizeof buf) == 0 && !strcmp(buf, "/home/u/.local/state/kvtop"));
    unsetenv("XDG_STATE_HOME");
    unsetenv("HOME");
    CHECK(kv_session_state_dir(buf, sizeof buf) == -1);
    if (old_x) setenv("XDG_STATE_HOME", old_x, 1);
    if (old_h) setenv("HOME", old_h, 1);
    free(old_x);
    free(old_h);
}

static void test_wrap(void) {
    kv_session *s = kv_session_new(0, NULL, NULL, 0);
    REQUIRE(s);
    kv_session_add(s, KV_ROLE_USER, "hello");
    kv_session_add(s, KV_ROLE_ASSISTANT, "one two three four five six");
    /* 15 columns minus a 5-column label: 10 per row. */
    CHECK(kv_session_wrap(s, 15, 5, NULL, 0) == 4);
    kv_tline l[8];
    int n = kv_session_wrap(s, 15, 5, l, 8);
    CHECK(n == 4 && l[0].turn == 0 && l[0].first && l[1].turn == 1 && l[1].first && !l[2].first);
    CHECK(!strncmp(s->turns[1].text + l[3].off, "five six", 8) && l[3].len == 8);
    /* Only the newest rows when the buffer is short. */
    n = kv_session_wrap(s, 15, 5, l, 2);
    CHECK(n == 4 && l[0].turn == 1 && !l[0].first && !strncmp(s->turns[1].text + l[1].off, "five six", 8));
    kv_session_free(s);
}

static void test_render(void) {
    kv_session *s = kv_session_new(0, NULL, NULL, 0);
    REQUIRE(s);
    char *buf = NULL;
    size_t cap = 0;
    CHECK(kv_session_render(s, 0, 1, KV_CHAT_PLAIN, NULL, &buf, &cap) == -1); /* nothing to send */
    kv_session_add(s, KV_ROLE_USER, "Once upon a time");
    /* Plain (a story model): the prompt as-is. */
    int n = kv_session_render(s, 0, 1, KV_CHAT_PLAIN, NULL, &buf, &cap);
    CHECK(n == 16 && !strcmp(buf, "Once upon a time"));
    kv_session_set_system(s, "A story.");
    n = kv_session_render(s, 0, 1, KV_CHAT_PLAIN, NULL, &buf, &cap);
    CHECKF(!strcmp(buf, "A story.\n\nOnce upon a time") && n == (int)strlen(buf), "[%s]", buf);
    /* ChatML: the whole conversation, the assistant's turn opened. */
    kv_session_add(s, KV_ROLE_ASSISTANT, "Hi there");
    s->turns[1].finish = 1;
    kv_session_add(s, KV_ROLE_USER, "Again");
    n = kv_session_render(s, 0, 0, KV_CHAT_CHATML, NULL, &buf, &cap);
    CHECKF(n > 0 && strstr(buf, "<|im_start|>system\nA story.<|im_end|>") &&
               strstr(buf, "<|im_start|>user\nOnce upon a time<|im_end|>") &&
               strstr(buf, "<|im_start|>assistant\nHi there<|im_end|>") &&
               strstr(buf, "<|im_start|>user\nAgain<|im_end|>"),
           "[%s]", buf);
    const char *tail = "<|im_start|>assistant\n";
    CHECK(n >= (int)strlen(tail) && !strcmp(buf + n - strlen(tail), tail));
    /* Starting later drops the oldest exchange but keeps the system prompt. */
    n = kv_session_render(s, kv_session_next_exchange(s, 0), 0, KV_CHAT_CHATML, NULL, &buf, &cap);
    CHECK(n > 0 && !strstr(buf, "Once upon a time") && strstr(buf, "A story.") && strstr(buf, "Again"));
    free(buf);
    kv_session_free(s);
}

/* The reply in flight keeps its own turn: notes added while it streams
 * (a /settings, a /temp) go after it, its text still lands in it, and its
 * end frees the tab whatever the last turn is. */
static void test_reply_keeps_its_turn(void) {
    char dir[] = "/tmp/kvtop-test-XXXXXX";
    REQUIRE(mkdtemp(dir));
    kv_session *s = kv_session_new(0, NULL, NULL, 0);
    REQUIRE(s);
    char msg[256];
    CHECK(kv_session_autosave_open(s, dir, "stamp", msg, sizeof msg) == 0);
    CHECK(kv_session_reply(s, 1) == NULL && kv_session_reply_append(s, "x", 1, 0) == -1);
    kv_session_add(s, KV_ROLE_USER, "Once upon a time");
    int r = kv_session_reply_begin(s, 7);
    CHECK(r == 1 && s->req == 7 && s->reply == 1 && kv_session_reply(s, 7) == &s->turns[1]);
    CHECK(kv_session_reply(s, 8) == NULL);
    CHECK(kv_session_reply_append(s, " there", 6, 0) == 0);
    kv_session_add(s, KV_ROLE_NOTE, "chat-1: temperature 0.50");
    kv_session_autosave_turn(s, KV_ROLE_NOTE, "chat-1: temperature 0.50");
    kv_session_add(s, KV_ROLE_NOTE, "system prompt set");
    kv_session_autosave_turn(s, KV_ROLE_NOTE, "system prompt set");
    /* The last turn is a note; the reply still finds its own. */
    CHECK(kv_session_last(s)->role == KV_ROLE_NOTE && kv_session_reply(s, 7) == &s->turns[1]);
    CHECK(kv_session_reply_append(s, " was", 4, 1) == 0);
    CHECK(!strcmp(s->turns[1].text, " there was") && s->turns[1].src[6] == 1 && s->turns[1].finish == 0);
    CHECK(!strcmp(s->turns[3].text, "system prompt set"));
    /* The open reply is not sent; the notes never are. */
    const char *roles[8], *texts[8];
    CHECK(kv_session_messages(s, 0, roles, texts, 8) == 1);
    kv_session_reply_end(s, 3);
    CHECK(s->req == 0 && s->reply == -1 && s->turns[1].finish == 3 && kv_session_reply(s, 7) == NULL);
    CHECK(kv_session_reply_append(s, "late", 4, 0) == -1 && !strcmp(s->turns[1].text, " there was"));
    CHECK(kv_session_messages(s, 0, roles, texts, 8) == 2 && !strcmp(texts[1], " there was"));
    kv_session_reply_end(s, 3); /* no reply in flight: no-op */
    kv_session_autosave_flush(s);
    /* The autosave has the whole reply: the part after the notes resumes. */
    char *disk = slurp(s->autosave_path);
    REQUIRE(disk);
    const char *a = strstr(disk, "## Assistant\n\n there"), *n = strstr(disk, "> system prompt set"),
               *c = strstr(disk, "## Assistant (continued)\n\n was");
    CHECKF(a && n && c && a < n && n < c, "%s", disk);
    /* Clearing forgets the reply in flight too. */
    CHECK(kv_session_reply_begin(s, 9) >= 0 && s->req == 9);
    kv_session_clear(s);
    CHECK(s->req == 0 && s->reply == -1 && kv_session_reply(s, 9) == NULL);
    CHECK(kv_session_reply_begin(s, 0) == -1 && s->n_turns == 0);
    unlink(s->autosave_path);
    rmdir(dir);
    kv_session_free(s);
}

TEST_MAIN(T(test_turns_and_messages), T(test_reply_keeps_its_turn), T(test_render), T(test_markdown_and_autosave),
          T(test_state_dir), T(test_wrap))
