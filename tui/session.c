/* session.c - chat session records: transcript turns, settings, the
 * messages sent through the chat template, Markdown export and the
 * append-only autosave log (see session.h). */
#include "session.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/vec.h"

kv_session *kv_session_new(int tag, const char *name, const kv_sampling *sampling, int max_tokens) {
    kv_session *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->tag = tag;
    if (name && *name) snprintf(s->name, sizeof s->name, "%s", name);
    else snprintf(s->name, sizeof s->name, "chat-%d", tag + 1);
    if (sampling) s->sampling = *sampling;
    else s->sampling.top_p = 1.0f, s->sampling.repeat_penalty = 1.0f;
    s->max_tokens = max_tokens > 0 ? max_tokens : 128;
    s->last_token_ms = -1;
    s->reply = -1;
    kv_series_clear(&s->itl);
    return s;
}

void kv_session_free(kv_session *s) {
    if (!s) return;
    for (int i = 0; i < s->n_turns; i++) {
        free(s->turns[i].text);
        free(s->turns[i].src);
    }
    free(s->turns);
    free(s->system);
    free(s->draft);
    if (s->autosave) fclose(s->autosave);
    free(s);
}

int kv_session_rename(kv_session *s, const char *name) {
    if (!s || !name || !*name) return -1;
    snprintf(s->name, sizeof s->name, "%s", name);
    return 0;
}

int kv_session_set_system(kv_session *s, const char *text) {
    if (!s) return -1;
    char *t = NULL;
    if (text && *text) {
        t = strdup(text);
        if (!t) return -1;
    }
    free(s->system);
    s->system = t;
    return 0;
}

int kv_session_add(kv_session *s, kv_role role, const char *text) {
    if (!s) return -1;
    if (!text) text = "";
    if (kv_grow((void **)&s->turns, &s->cap_turns, s->n_turns + 1, sizeof *s->turns)) return -1;
    size_t len = strlen(text);
    size_t cap = len + 64;
    char *t = malloc(cap);
    uint8_t *src = calloc(cap, 1);
    if (!t || !src) {
        free(t);
        free(src);
        return -1;
    }
    memcpy(t, text, len + 1);
    s->turns[s->n_turns] =
        (kv_turn){.role = role, .text = t, .src = src, .len = len, .cap = cap, .ttft_ms = -1, .tpot_ms = -1};
    return s->n_turns++;
}

/* Appends bytes to turn t, marking them as produced by source. 0 or -1. */
static int turn_append(kv_turn *t, const char *text, size_t len, int source) {
    if (!text || len == 0) return 0;
    if (t->len + len + 1 > t->cap) {
        size_t nc = (t->len + len + 1) * 2;
        char *nt = realloc(t->text, nc);
        if (!nt) return -1;
        t->text = nt;
        uint8_t *ns = realloc(t->src, nc);
        if (!ns) return -1; /* text grew but cap did not: still consistent */
        t->src = ns;
        t->cap = nc;
    }
    memcpy(t->text + t->len, text, len);
    memset(t->src + t->len, source, len);
    t->len += len;
    t->text[t->len] = 0;
    return 0;
}

int kv_session_append_src(kv_session *s, const char *text, size_t len, int source) {
    if (!s || s->n_turns == 0) return -1;
    return turn_append(&s->turns[s->n_turns - 1], text, len, source);
}

int kv_session_append(kv_session *s, const char *text, size_t len) { return kv_session_append_src(s, text, len, 0); }

void kv_session_clear(kv_session *s) {
    if (!s) return;
    for (int i = 0; i < s->n_turns; i++) {
        free(s->turns[i].text);
        free(s->turns[i].src);
    }
    s->n_turns = 0;
    s->scroll = 0;
    s->req = 0;
    s->reply = -1;
    s->autosave_split = 0;
}

kv_turn *kv_session_last(kv_session *s) { return s && s->n_turns ? &s->turns[s->n_turns - 1] : NULL; }

int kv_session_reply_begin(kv_session *s, int64_t req) {
    if (!s || req <= 0) return -1;
    int t = kv_session_add(s, KV_ROLE_ASSISTANT, "");
    if (t < 0) return -1;
    s->turns[t].req = req;
    s->req = req;
    s->reply = t;
    s->autosave_split = 0;
    kv_session_autosave_turn(s, KV_ROLE_ASSISTANT, "");
    return t;
}

kv_turn *kv_session_reply(kv_session *s, int64_t req) {
    if (!s || req <= 0 || s->req != req || s->reply < 0 || s->reply >= s->n_turns) return NULL;
    kv_turn *t = &s->turns[s->reply];
    return t->role == KV_ROLE_ASSISTANT && t->req == req ? t : NULL;
}

int kv_session_reply_append(kv_session *s, const char *text, size_t len, int source) {
    kv_turn *t = s ? kv_session_reply(s, s->req) : NULL;
    if (!t) return -1;
    if (!text || len == 0) return 0;
    if (s->autosave && s->autosave_split) {
        /* A note was logged since the reply's last text: resume it. */
        fputs("\n\n## Assistant (continued)\n\n", s->autosave);
        s->autosave_split = 0;
    }
    kv_session_autosave_text(s, text, len);
    return turn_append(t, text, len, source);
}

void kv_session_reply_end(kv_session *s, int finish) {
    kv_turn *t = s ? kv_session_reply(s, s->req) : NULL;
    if (!t) return;
    t->finish = finish > 0 ? finish : 1;
    /* The reply's paragraph ends here (a note after it ended it already). */
    if (!s->autosave_split) kv_session_autosave_text(s, "\n", 1);
    s->autosave_split = 0;
    s->req = 0;
    s->reply = -1;
}

int kv_session_messages(const kv_session *s, int first, const char **roles, const char **texts, int cap) {
    if (!s || !roles || !texts) return -1;
    int n = 0;
    if (first < 0) first = 0;
    if (s->system) {
        if (n >= cap) return -1;
        roles[n] = "system";
        texts[n] = s->system;
        n++;
    }
    for (int i = first; i < s->n_turns; i++) {
        const kv_turn *t = &s->turns[i];
        if (t->role == KV_ROLE_NOTE) continue;
        /* The reply being produced is the template's open assistant turn. */
        if (t->role == KV_ROLE_ASSISTANT && t->finish == 0) continue;
        if (n >= cap) return -1;
        roles[n] = t->role == KV_ROLE_USER ? "user" : "assistant";
        texts[n] = t->text;
        n++;
    }
    return n;
}

int kv_session_render(const kv_session *s, int first, int plain, kv_chat_tmpl tmpl, const char *template_text,
                      char **buf, size_t *cap) {
    if (!s || !buf || !cap) return -1;
    if (plain) {
        const kv_turn *u = NULL;
        for (int i = s->n_turns - 1; i >= 0 && !u; i--)
            if (s->turns[i].role == KV_ROLE_USER) u = &s->turns[i];
        if (!u) return -1;
        size_t sl = s->system ? strlen(s->system) : 0;
        if (kv_grow_size((void **)buf, cap, sl + 2 + u->len + 1, 1)) return -1;
        int n = snprintf(*buf, *cap, "%s%s%s", s->system ? s->system : "", s->system ? "\n\n" : "", u->text);
        return n;
    }
    enum { MAXMSG = 1024 };
    const char *roles[MAXMSG], *texts[MAXMSG];
    kv_chat_msg msgs[MAXMSG];
    int n = kv_session_messages(s, first, roles, texts, MAXMSG);
    if (n <= 0) return -1;
    for (int i = 0; i < n; i++) msgs[i] = (kv_chat_msg){roles[i], texts[i]};
    int len = kv_chat_format_ex(tmpl, template_text, 0, msgs, n, 1, NULL, 0);
    if (len < 0 || kv_grow_size((void **)buf, cap, (size_t)len + 1, 1)) return -1;
    kv_chat_format_ex(tmpl, template_text, 0, msgs, n, 1, *buf, *cap);
    return len;
}

int kv_session_next_exchange(const kv_session *s, int first) {
    if (!s) return -1;
    if (first < 0) first = 0;
    /* Skip the first user turn, then find the next user turn. */
    int i = first;
    while (i < s->n_turns && s->turns[i].role != KV_ROLE_USER) i++;
    for (i++; i < s->n_turns; i++)
        if (s->turns[i].role == KV_ROLE_USER) return i;
    return -1;
}

static const char *role_heading(kv_role r) {
    return r == KV_ROLE_USER ? "You" : r == KV_ROLE_ASSISTANT ? "Assistant" : "Note";
}

/* Writes text as a Markdown quote ("> " before every line). */
static void write_quoted(FILE *f, const char *text) {
    fputs("> ", f);
    for (const char *p = text; *p; p++) {
        fputc(*p, f);
        if (*p == '\n' && p[1]) fputs("> ", f);
    }
    fputc('\n', f);
}

int kv_session_save_markdown(const kv_session *s, const char *path, char *msg, size_t cap) {
    if (msg && cap) msg[0] = 0;
    if (!s || !path || !*path) {
        if (msg) snprintf(msg, cap, "no file name");
        return -1;
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        if (msg) snprintf(msg, cap, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    fprintf(f, "# %s\n\n", s->name);
    if (s->system) {
        fputs("System prompt:\n\n", f);
        write_quoted(f, s->system);
        fputc('\n', f);
    }
    for (int i = 0; i < s->n_turns; i++) {
        const kv_turn *t = &s->turns[i];
        if (t->role == KV_ROLE_NOTE) {
            write_quoted(f, t->text);
            fputc('\n', f);
            continue;
        }
        fprintf(f, "## %s\n\n%s\n\n", role_heading(t->role), t->text);
    }
    int bad = ferror(f);
    if (fclose(f) || bad) {
        if (msg) snprintf(msg, cap, "error writing %s", path);
        return -1;
    }
    return 0;
}

int kv_session_state_dir(char *buf, size_t cap) {
    const char *x = getenv("XDG_STATE_HOME");
    int n;
    if (x && *x == '/') n = snprintf(buf, cap, "%s/kvtop", x);
    else {
        const char *h = getenv("HOME");
        if (!h || !*h) return -1;
        n = snprintf(buf, cap, "%s/.local/state/kvtop", h);
    }
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* mkdir -p: creates every missing component of path. */
static int mkdirs(const char *path) {
    char tmp[1024];
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof tmp) return -1;
    memcpy(tmp, path, len + 1);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0700) && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(tmp, 0700) && errno != EEXIST) return -1;
    return 0;
}

int kv_session_autosave_open(kv_session *s, const char *dir, const char *stamp, char *msg, size_t cap) {
    if (msg && cap) msg[0] = 0;
    if (!s || !dir || !stamp) return -1;
    if (mkdirs(dir)) {
        if (msg) snprintf(msg, cap, "cannot create %s: %s", dir, strerror(errno));
        return -1;
    }
    char path[1024];
    int n = snprintf(path, sizeof path, "%s/%s-%d.md", dir, stamp, s->tag + 1);
    if (n < 0 || (size_t)n >= sizeof path) {
        if (msg) snprintf(msg, cap, "autosave path too long under %s", dir);
        return -1;
    }
    FILE *f = fopen(path, "a");
    if (!f) {
        if (msg) snprintf(msg, cap, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    if (s->autosave) fclose(s->autosave);
    s->autosave = f;
    snprintf(s->autosave_path, sizeof s->autosave_path, "%s", path);
    fprintf(f, "# %s\n\n", s->name);
    fflush(f);
    return 0;
}

void kv_session_autosave_turn(kv_session *s, kv_role role, const char *text) {
    if (!s || !s->autosave) return;
    if (role == KV_ROLE_NOTE) {
        fputc('\n', s->autosave);
        write_quoted(s->autosave, text ? text : "");
        /* In the middle of a reply: its next text resumes under a heading. */
        if (s->reply >= 0) s->autosave_split = 1;
    } else {
        fprintf(s->autosave, "\n## %s\n\n%s", role_heading(role), text ? text : "");
        if (role == KV_ROLE_USER) fputc('\n', s->autosave);
    }
    /* A typed prompt reaches the kernel at once. */
    fflush(s->autosave);
}

void kv_session_autosave_text(kv_session *s, const char *text, size_t len) {
    if (!s || !s->autosave || !text || !len) return;
    fwrite(text, 1, len, s->autosave);
}

void kv_session_autosave_flush(kv_session *s) {
    if (s && s->autosave) fflush(s->autosave);
}

int kv_session_wrap(const kv_session *s, int cols, int indent, kv_tline *out, int cap) {
    if (!s) return 0;
    if (indent < 0) indent = 0;
    int w = cols - indent;
    if (w < 1) w = 1;
    /* Two passes: count, then emit the newest `cap` rows. No allocation:
     * the transcript may be long but wrapping is linear and cheap. */
    int total = 0;
    for (int pass = 0; pass < (out ? 2 : 1); pass++) {
        int row = 0;
        int skip = out && total > cap ? total - cap : 0;
        for (int i = 0; i < s->n_turns; i++) {
            const kv_turn *t = &s->turns[i];
            kv_wrap_iter it;
            kv_wrap_line l;
            kv_format_wrap_begin(&it);
            int first = 1;
            while (kv_format_wrap_next(t->text, (int)t->len, w, &it, &l)) {
                if (pass == 1 && row >= skip && row - skip < cap) {
                    kv_tline *o = &out[row - skip];
                    o->turn = i;
                    o->off = l.off;
                    o->len = l.len;
                    o->first = first;
                }
                first = 0;
                row++;
            }
        }
        total = row;
    }
    return total;
}
