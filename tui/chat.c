/* chat.c - the chat tabs over the engine: one kv_session per tab, the
 * prompt each sends (the conversation through the model's chat template,
 * cut to fit the context) and the engine events that fill in the replies.
 * Background load events are counted here too (their inter-token latency). */
#include "app_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- sessions ---- */

kv_session *chat_session_add(app *a, const char *name) {
    if (a->n_sessions >= MAX_SESSIONS) {
        app_status(a, 1, "at most %d tabs", MAX_SESSIONS);
        return NULL;
    }
    /* A tag whose block-map glyph no open tab has (tags wrap below the
     * load range). */
    int live[MAX_SESSIONS];
    for (int i = 0; i < a->n_sessions; i++) live[i] = a->sessions[i]->tag;
    int tag = kv_blockmap_pick_tag(a->next_tag, live, a->n_sessions);
    kv_session *s = tag >= 0 ? kv_session_new(tag, name, &a->cfg.sampling, 256) : NULL;
    if (!s) {
        app_status(a, 1, "out of memory");
        return NULL;
    }
    a->next_tag = (tag + 1) % KV_SESSION_LOAD_BASE;
    s->history = kv_input_history_new();
    if (a->state_dir[0]) {
        char msg[256];
        if (kv_session_autosave_open(s, a->state_dir, a->stamp, msg, sizeof msg) && !a->autosave_warned) {
            app_status(a, 1, "autosave off: %s", msg);
            a->autosave_warned = 1;
        }
    }
    a->sessions[a->n_sessions++] = s;
    return s;
}

/* Makes tab i the selected one, moving readline's history and draft. */
void chat_session_select(app *a, int i) {
    if (i < 0 || i >= a->n_sessions || i == a->selected) return;
    kv_session *from = app_cur(a), *to = a->sessions[i];
    kv_input_history_switch(&from->history, &from->draft, &to->history, to->draft);
    free(to->draft);
    to->draft = NULL;
    a->selected = i;
    to->unread = 0;
}

void chat_session_close(app *a, int i) {
    if (i < 0 || i >= a->n_sessions) return;
    kv_session *s = a->sessions[i];
    if (s->req && a->eng) kv_engine_cancel(a->eng, s->req);
    if (s->req && a->att) attach_cancel(a, s);
    if (a->n_sessions == 1) {
        /* The last tab is cleared rather than closed: there is always one. */
        kv_session_clear(s);
        app_status(a, 0, "last tab cleared");
        return;
    }
    if (i == a->selected) chat_session_select(a, i + 1 < a->n_sessions ? i + 1 : i - 1);
    /* Now s is not the active readline history: its slot holds it. */
    kv_input_history_free(s->history);
    s->history = NULL;
    kv_session_free(s);
    memmove(&a->sessions[i], &a->sessions[i + 1], (size_t)(a->n_sessions - i - 1) * sizeof a->sessions[0]);
    a->n_sessions--;
    if (a->selected > i) a->selected--;
}

static kv_session *session_by_tag(app *a, int tag) {
    for (int i = 0; i < a->n_sessions; i++)
        if (a->sessions[i]->tag == tag) return a->sessions[i];
    return NULL;
}

/* ---- submitting prompts ---- */

/* The prompt ids of the conversation from turn `first` into ids (room for
 * a->max_ctx): through the chat template, its markers special and every
 * turn's text plain, so a typed "<|im_end|>" cannot forge a turn
 * (kv_chat_tokenize); with no template, the system prompt and the latest
 * user turn as plain text. Returns the count, KV_ERR_RANGE when longer than
 * the context (found without encoding all of it), or another KV_ERR_*. */
static int encode_prompt(app *a, kv_session *s, int first, int32_t *ids) {
    const kv_tokenizer *tok = a->model->tok;
    if (a->plain) {
        int len = kv_session_render(s, first, 1, a->tmpl, NULL, &a->prompt_buf, &a->prompt_cap);
        if (len < 0) return KV_ERR_NOMEM;
        kv_encode_opts o = {.add_bos = kv_tokenizer_add_bos(tok), .max_tokens = a->max_ctx};
        return kv_tokenizer_encode_ex(tok, a->prompt_buf, (size_t)len, &o, ids, a->max_ctx, NULL);
    }
    enum { MAXMSG = 1024 };
    const char *roles[MAXMSG], *texts[MAXMSG];
    kv_chat_msg msgs[MAXMSG];
    int n = kv_session_messages(s, first, roles, texts, MAXMSG);
    if (n <= 0) return KV_ERR_INVAL;
    for (int i = 0; i < n; i++) msgs[i] = (kv_chat_msg){roles[i], texts[i]};
    kv_chat_tok_params cp;
    kv_chat_tok_defaults(&cp); /* the template's default system message left out, as before */
    cp.max_tokens = a->max_ctx;
    return kv_chat_tokenize(a->tmpl, a->model->chat_template, tok, msgs, n, &cp, ids, a->max_ctx, NULL);
}

/* Sends the session's conversation (its last turn is the user's prompt). */
void chat_submit(app *a, kv_session *s) {
    if (!a->eng) {
        s->waiting_engine = 1;
        return;
    }
    s->waiting_engine = 0;
    if (a->model && a->model->synthetic) {
        app_note(s, "chat is off: %s has shapes but no weights, so its replies would be made-up ids; "
                    "F5 injects the profile's workload", a->model->name);
        return;
    }
    int first = 0, max_tokens = s->max_tokens;
    int n_tok = 0;
    int32_t *ids = malloc((size_t)a->max_ctx * sizeof *ids);
    if (!ids) {
        app_note(s, "out of memory for a %d-token prompt", a->max_ctx);
        return;
    }
    /* Drop the oldest exchanges until prompt + reply fit the context. */
    for (;;) {
        n_tok = encode_prompt(a, s, first, ids);
        if (n_tok < 0 && n_tok != KV_ERR_RANGE) {
            app_note(s, "cannot encode the prompt (%s)", kv_err_str(n_tok));
            free(ids);
            return;
        }
        if (n_tok >= 0 && n_tok + max_tokens <= a->max_ctx) break;
        int next = kv_session_next_exchange(s, first);
        if (next < 0) {
            max_tokens = n_tok < 0 ? 0 : a->max_ctx - n_tok;
            if (max_tokens < 1) {
                if (n_tok < 0) app_note(s, "the prompt is longer than the %d-token context", a->max_ctx);
                else app_note(s, "the prompt is %d tokens, more than the %d-token context", n_tok, a->max_ctx);
                free(ids);
                return;
            }
            break;
        }
        first = next;
    }
    kv_request_params p;
    kv_engine_request_defaults(a->eng, &p);
    p.tokens = ids;
    p.n_tokens = n_tok;
    p.max_tokens = max_tokens;
    p.sampling = s->sampling;
    p.session = s->tag;
    const char *stop[1];
    if (!a->plain) {
        stop[0] = kv_chat_end_of_turn(a->tmpl);
        p.stop = stop;
        p.n_stop = 1;
    }
    kv_err err;
    int64_t id = kv_engine_submit(a->eng, &p, &err);
    free(ids); /* copied by the engine */
    if (id < 0) {
        app_note(s, "rejected: %s", err.msg);
        return;
    }
    s->last_token_ms = -1;
    if (kv_session_reply_begin(s, id) < 0) {
        kv_engine_cancel(a->eng, id);
        app_note(s, "out of memory: the reply was cancelled");
        return;
    }
    if (first > 0) app_status(a, 0, "older turns left out to fit the %d-token context", a->max_ctx);
}

void chat_send_prompt(app *a, kv_session *s, const char *text) {
    if (s->req) {
        app_status(a, 1, "a reply is still coming in this tab: Esc cancels it, or /new for another tab");
        return;
    }
    kv_session_add(s, KV_ROLE_USER, text);
    kv_session_autosave_turn(s, KV_ROLE_USER, text);
    s->scroll = 0;
    if (a->att) {
        attach_submit(a, s);
        return;
    }
    if (!a->eng) {
        s->waiting_engine = 1;
        if (a->v.phase == KV_PHASE_FAILED) app_note(s, "no engine: %s (/load PROFILE to try another)", a->v.load_msg);
        return;
    }
    chat_submit(a, s);
}

/* ---- engine events ---- */

static void queue_forget(app *a, int64_t id) {
    if (a->n_forget < FORGET_CAP) a->forget[a->n_forget++] = id;
    else if (a->eng) kv_engine_forget(a->eng, id);
}

static void handle_event(app *a, const kv_event *ev) {
    if (ev->session >= KV_SESSION_LOAD_BASE) {
        int k = load_slot(a, ev->req);
        if (k < 0) {
            if (ev->type == KV_EVENT_DONE) queue_forget(a, ev->req);
            return;
        }
        if (ev->type == KV_EVENT_TOKEN) {
            if (a->load.last_tok_ms[k] >= 0) {
                double itl = ev->t_ms - a->load.last_tok_ms[k];
                kv_series_push(&a->itl_all, itl);
                kv_series_push(&a->itl_load, itl);
            }
            a->load.last_tok_ms[k] = ev->t_ms;
        } else {
            a->load.n_inflight--;
            a->load.inflight[k] = a->load.inflight[a->load.n_inflight];
            a->load.last_tok_ms[k] = a->load.last_tok_ms[a->load.n_inflight];
            queue_forget(a, ev->req);
        }
        return;
    }
    kv_session *s = session_by_tag(a, ev->session);
    if (ev->type == KV_EVENT_DONE) queue_forget(a, ev->req);
    /* The reply's own turn, wherever it is: notes typed while it streams
     * come after it. NULL: a cancelled reply, or one of a closed or
     * cleared tab. */
    kv_turn *t = s ? kv_session_reply(s, ev->req) : NULL;
    if (!t) return;
    if (ev->type == KV_EVENT_TOKEN) {
        if (ev->text_len > 0) {
            int len = ev->text_len < (int)sizeof ev->text ? ev->text_len : (int)sizeof ev->text;
            kv_session_reply_append(s, ev->text, (size_t)len, (int)ev->source);
        }
        t->n_tokens++;
        if (s->last_token_ms >= 0) {
            double itl = ev->t_ms - s->last_token_ms;
            kv_series_push(&s->itl, itl);
            kv_series_push(&a->itl_all, itl);
        }
        s->last_token_ms = ev->t_ms;
        if (s != app_cur(a)) s->unread = 1;
        return;
    }
    /* Done. A stop string that ended the reply is not part of it. */
    if (ev->finish == KV_FINISH_STOP && !a->plain) {
        const char *eot = kv_chat_end_of_turn(a->tmpl);
        size_t el = strlen(eot);
        if (el && t->len >= el && !memcmp(t->text + t->len - el, eot, el)) {
            t->len -= el;
            t->text[t->len] = 0;
        }
    }
    int n_tokens = t->n_tokens;
    kv_session_reply_end(s, ev->finish ? (int)ev->finish : KV_FINISH_EOS);
    s->last_token_ms = -1;
    if (ev->finish == KV_FINISH_CANCELLED) app_note(s, "[cancelled]");
    else if (ev->finish == KV_FINISH_REJECTED || ev->finish == KV_FINISH_ERROR)
        app_note(s, "[%s: %s]", ev->finish == KV_FINISH_REJECTED ? "rejected" : "error", ev->reason);
    else if (ev->finish == KV_FINISH_LENGTH) app_note(s, "[reply cut at %d tokens: /max N for longer]", n_tokens);
    if (s != app_cur(a)) s->unread = 1;
}

void chat_cancel(app *a, kv_session *s) {
    if (!s || !s->req) {
        app_status(a, 0, "no reply to cancel in this tab");
        return;
    }
    /* The engine's DONE for it comes later (or not at all when it had just
     * finished); the tab is free now either way, and that DONE is then
     * only forgotten. */
    if (a->eng) kv_engine_cancel(a->eng, s->req);
    if (a->att) attach_cancel(a, s);
    kv_session_reply_end(s, KV_FINISH_CANCELLED);
    s->last_token_ms = -1;
    app_note(s, "[cancelled]");
    app_status(a, 0, "reply cancelled");
}

void chat_poll_events(app *a) {
    if (a->att) attach_poll(a);
    if (!a->eng) return;
    kv_event ev[64];
    for (int round = 0; round < 64; round++) {
        /* while serving, the server's dispatcher reads the engine and hands the tabs theirs */
        int n = a->srv ? serve_poll(a, ev, 64) : kv_engine_poll(a->eng, ev, 64);
        for (int i = 0; i < n; i++) handle_event(a, &ev[i]);
        if (n < 64) break;
    }
    for (int i = 0; i < a->n_sessions; i++) kv_session_autosave_flush(a->sessions[i]);
}
