/* session.h - one chat session (a TUI tab): its transcript, system prompt,
 * sampling settings, the request in flight, per-token timing, and an
 * autosave file that receives every typed prompt and every received piece
 * of text as it happens, so nothing is lost if the app is killed.
 * No curses and no engine calls here: the app submits and polls, the
 * session keeps the record (tests/tui/test_session.c). */
#ifndef KV_TUI_SESSION_H
#define KV_TUI_SESSION_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../engine/chat_template.h"
#include "../engine/config.h"
#include "format.h"

typedef enum kv_role {
    KV_ROLE_USER = 0,
    KV_ROLE_ASSISTANT = 1,
    KV_ROLE_NOTE = 2 /* shown in the transcript only (errors, settings); never sent */
} kv_role;

typedef struct kv_turn {
    kv_role role;
    char *text;      /* NUL-terminated, owned */
    size_t len, cap; /* bytes used / allocated in text */
    uint8_t *src;    /* (cap) kv_token_source of each byte of text (assistant turns), owned */
    int64_t req;     /* assistant: the engine request that produced it (0 none) */
    int n_tokens;    /* assistant: tokens received */
    int finish;      /* assistant: kv_finish once done (0 while streaming) */
    double ttft_ms;  /* assistant: time to first token, ms, < 0 unknown */
    double tpot_ms;  /* assistant: mean time per output token after the first, ms, < 0 unknown */
} kv_turn;

typedef struct kv_session {
    int tag;                /* engine session tag: unique, never reused */
    char name[32];          /* tab label */
    char *system;           /* system prompt (owned), NULL for none */
    kv_sampling sampling;   /* sampling of its requests */
    int max_tokens;         /* reply length limit */
    kv_turn *turns;         /* (n_turns) the transcript */
    int n_turns, cap_turns;
    int64_t req;            /* request in flight, 0 none */
    int reply;              /* index of the turn req's reply streams into, -1 none: notes
                             * added while it streams go after it without ending it */
    int autosave_split;     /* bool: a note reached the autosave in the middle of the reply */
    int waiting_engine;     /* bool: a prompt is queued until the engine is ready */
    double submit_ms;       /* engine clock at submit (from kv_event times) */
    double last_token_ms;   /* engine clock of the newest token, < 0 none */
    kv_series itl;          /* inter-token latencies of its replies, ms (TPOT per token) */
    int scroll;             /* transcript rows scrolled back from the newest */
    int unread;             /* bool: text arrived while another tab was shown */
    void *history;          /* readline history of this tab (input.c owns the type) */
    char *draft;            /* half-typed input kept while another tab is shown (owned) */
    FILE *autosave;         /* append-only Markdown log, NULL when autosave is off */
    char autosave_path[1024];
} kv_session;

/* A new session. name NULL: "chat-<tag+1>". Returns NULL on allocation failure. */
kv_session *kv_session_new(int tag, const char *name, const kv_sampling *sampling, int max_tokens);
void kv_session_free(kv_session *s); /* closes the autosave file; NULL is a no-op */

/* Renames (cut to 31 bytes; empty names rejected with -1). */
int kv_session_rename(kv_session *s, const char *name);
/* Sets the system prompt (NULL or "" removes it). 0 or -1 on allocation failure. */
int kv_session_set_system(kv_session *s, const char *text);

/* Appends a turn holding a copy of text; returns its index or -1. */
int kv_session_add(kv_session *s, kv_role role, const char *text);
/* Appends bytes to the last turn (the reply being streamed), marking them
 * as produced by `source` (a kv_token_source: decode, accepted draft,
 * bonus); 0 or -1. kv_session_append is the same with source 0. */
int kv_session_append(kv_session *s, const char *text, size_t len);
int kv_session_append_src(kv_session *s, const char *text, size_t len, int source);
/* Forgets the whole transcript (the autosave file keeps it) and the reply
 * in flight (the caller cancels its request). */
void kv_session_clear(kv_session *s);

/* The reply in flight. The reply keeps its own turn: it is found by the
 * request id, never as "the last turn", so notes and settings added while
 * it streams do not cut it off.
 * _begin adds an empty assistant turn for request req (> 0), makes it the
 * reply in flight (s->req, s->reply) and opens it in the autosave; returns
 * its index or -1 (allocation; nothing changes). */
int kv_session_reply_begin(kv_session *s, int64_t req);
/* The turn streaming request req's reply, or NULL when req is not the
 * reply in flight (a cancelled, finished or cleared one). */
kv_turn *kv_session_reply(kv_session *s, int64_t req);
/* Appends streamed text to the reply in flight (its turn and the autosave,
 * which resumes the reply under a new heading when a note came between);
 * 0, or -1 when there is no reply in flight or memory ran out. */
int kv_session_reply_append(kv_session *s, const char *text, size_t len, int source);
/* Ends the reply in flight with finish (a kv_finish, > 0): the tab is free
 * for the next prompt. No-op when none is in flight. */
void kv_session_reply_end(kv_session *s, int finish);
/* The last turn, or NULL. */
kv_turn *kv_session_last(kv_session *s);

/* Messages to send for the conversation: the system prompt (if any), then
 * the user and assistant turns from index `first` on (notes skipped; an
 * unfinished assistant turn, i.e. the one being answered, is left out).
 * roles[] and texts[] receive borrowed pointers; returns the count, or -1
 * when cap is too small. */
int kv_session_messages(const kv_session *s, int first, const char **roles, const char **texts, int cap);
/* The prompt text for the conversation from turn `first` on, into *buf
 * (grown with realloc as needed; *cap its size). plain (the model has no
 * chat template): the latest user turn as-is, after the system prompt and a
 * blank line, so a story model continues it. Otherwise the messages in
 * template tmpl (template_text: the model's own Jinja text or NULL) with the
 * assistant's turn opened. Returns the text length, or -1 (allocation, no
 * user turn, or a template error). */
int kv_session_render(const kv_session *s, int first, int plain, kv_chat_tmpl tmpl, const char *template_text,
                      char **buf, size_t *cap);
/* Index of the first turn of the second-oldest exchange after `first`
 * (where to start when the oldest must be dropped to fit the context), or
 * -1 when only one exchange is left. */
int kv_session_next_exchange(const kv_session *s, int first);

/* Writes the transcript as Markdown ("# name", "## You" / "## Assistant"
 * sections, notes as quotes). 0, or -1 with msg naming the file. */
int kv_session_save_markdown(const kv_session *s, const char *path, char *msg, size_t cap);

/* The autosave directory: $XDG_STATE_HOME/kvtop, else $HOME/.local/state/kvtop.
 * Writes it to buf; 0, or -1 when neither variable is set. */
int kv_session_state_dir(char *buf, size_t cap);
/* Opens <dir>/<stamp>-<tag>.md for appending (creating dir and parents) and
 * writes the header. 0, or -1 with msg. */
int kv_session_autosave_open(kv_session *s, const char *dir, const char *stamp, char *msg, size_t cap);
/* Records a new turn / streamed text in the autosave file (no-op without
 * one). Written at once; kv_session_autosave_flush pushes it to the kernel. */
void kv_session_autosave_turn(kv_session *s, kv_role role, const char *text);
void kv_session_autosave_text(kv_session *s, const char *text, size_t len);
void kv_session_autosave_flush(kv_session *s);

/* One row of the transcript as drawn: bytes [off, off+len) of turn `turn`. */
typedef struct kv_tline {
    int turn;
    int off, len;
    int first;  /* bool: first row of the turn (gets the role label) */
} kv_tline;

/* Wraps the transcript to `cols` columns (label prefix included: rows of a
 * turn are indented by `indent` columns after the first) and returns the
 * number of rows; writes the last min(rows, cap) of them to out (oldest
 * first) when out is non-NULL. */
int kv_session_wrap(const kv_session *s, int cols, int indent, kv_tline *out, int cap);

#endif
