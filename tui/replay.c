/* replay.c - `kvtop replay FILE`: steps through a recorded trace one engine
 * step at a time, drawing each frame's snapshot with the app's panels, or
 * exports it as Chrome trace-event JSON. */
#include "app_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/cleanup.h"
#include "tui.h"

/* Refuses `path` as a file an export to `out` writes (out itself, or its
 * temporary file; what names it in the message): one that exists and is
 * not a regular file, or that is the trace's own file (same inode: the
 * path itself, a hard link, a symlink to it). follow 0: a symlink is not
 * followed (and so refused), for the temporary file that is written
 * through. 0 or a KV_ERR_* with err. */
static int export_target_ok(const char *out, const char *path, const char *what, int follow,
                            const struct stat *trace, kv_err *err) {
    struct stat st;
    if (follow ? stat(path, &st) : lstat(path, &st)) {
        if (errno == ENOENT) return 0;
        return kv_err_set(err, KV_ERR_IO, "cannot export to %s: %s: %s", out, path, strerror(errno));
    }
    if (trace && st.st_dev == trace->st_dev && st.st_ino == trace->st_ino)
        return kv_err_set(err, KV_ERR_INVAL, "cannot export to %s: %s is the trace itself", out, what);
    if (!S_ISREG(st.st_mode))
        return kv_err_set(err, KV_ERR_INVAL, "cannot export to %s: %s is not a regular file", out, what);
    return 0;
}

int replay_export(kv_trace *t, const char *trace_path, const char *out, kv_err *err) {
    if (!t || !out || !*out) return kv_err_set(err, KV_ERR_INVAL, "export: no file name");
    char tmp[4200], what[4300];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp", out);
    if (n < 0 || (size_t)n >= sizeof tmp) return kv_err_set(err, KV_ERR_RANGE, "export: file name too long");
    snprintf(what, sizeof what, "its temporary file %s", tmp);
    struct stat tr;
    const struct stat *trp = trace_path && stat(trace_path, &tr) == 0 ? &tr : NULL;
    int rc = export_target_ok(out, out, "it", 1, trp, err);
    if (!rc) rc = export_target_ok(out, tmp, what, 0, trp, err);
    if (rc) return rc;
    /* Written beside it and renamed: a failed or interrupted export leaves
     * the old file (if any) as it was. */
    kv_cleanup_add(tmp);
    rc = kv_trace_export_chrome(t, tmp, err);
    if (!rc && rename(tmp, out))
        rc = kv_err_set(err, KV_ERR_IO, "cannot rename %s to %s: %s", tmp, out, strerror(errno));
    if (rc) unlink(tmp);
    kv_cleanup_remove(tmp);
    return rc;
}

/* Shows frame replay_i: the only kv_trace_frame call, so a->shown stays
 * valid until the next one. */
static void replay_show(app *a) {
    const kv_snapshot *s = kv_trace_frame(a->replay, a->replay_i);
    a->shown = s;
    a->v.replay_frame = a->replay_i;
    /* The step log shows this frame's decisions. */
    a->log_n = 0;
    a->log_head = 0;
    if (s)
        for (int i = 0; i < s->n_decisions; i++) app_log_push(a, &s->decisions[i]);
}

static void replay_key(app *a, kv_key k) {
    int n = kv_trace_n_frames(a->replay);
    int before = a->replay_i;
    if (a->v.help_shown) {
        a->v.help_shown = 0;
        return;
    }
    switch (k.code) {
    case 'q':
    case KV_KEY_CTRL('c'):
    case KV_KEY_F(10): a->quit = 1; return;
    case KV_KEY_LEFT:
    case 'p':
    case 'b': a->replay_i--; break;
    case KV_KEY_RIGHT:
    case 'n':
    case ' ':
    case 'f': a->replay_i++; break;
    case KV_KEY_PGUP: a->replay_i -= 10; break;
    case KV_KEY_PGDN: a->replay_i += 10; break;
    case KV_KEY_HOME: a->replay_i = 0; break;
    case KV_KEY_END: a->replay_i = n - 1; break;
    case 'z':
    case KV_KEY_F(6): app_zoom_next(a); break;
    case KV_KEY_ESC: a->zoom = -1; break;
    case '?':
    case KV_KEY_F(1): a->v.help_shown = 1; break;
    case KV_KEY_UP: a->v.log_scroll++; break;
    case KV_KEY_DOWN:
        if (a->v.log_scroll > 0) a->v.log_scroll--;
        break;
    case 't':
        if (a->color_ok) a->v.color = !a->v.color;
        break;
    case KV_KEY_F(9): /* the trace's blocks carry their fill */
        a->v.fill_marks = !a->v.fill_marks;
        app_status(a, 0, "block map: %s", a->v.fill_marks ? "fill of each block" : "owner of each block");
        break;
    case KV_KEY_RESIZE: a->need_clear = 1; break;
    case KV_KEY_CTRL('z'): app_suspend(a); break;
    default: break;
    }
    if (a->replay_i < 0) a->replay_i = 0;
    if (a->replay_i >= n) a->replay_i = n - 1;
    if (a->replay_i != before) replay_show(a);
}

static void replay_frame(app *a) {
    app_draw(a);
    a->v.frames++;
    app_update_cpu(a);
}

int cmd_replay(int argc, char **argv) {
    const char *path = NULL, *export_path = NULL;
    long frames = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: kvtop replay FILE [--export OUT.json] [--frames N]\n"
                   "  steps through a trace recorded with F7, /record or `kvtop --record FILE`:\n"
                   "  one frame per engine step: Left/Right one step, PgUp/PgDn ten, Home/End, z zoom,\n"
                   "  F9 block fill / owner marks, q quit.\n"
                   "  --export writes Chrome trace-event JSON (Perfetto, chrome://tracing) and exits.\n");
            return 0;
        } else if (!strcmp(argv[i], "--export") && i + 1 < argc) {
            export_path = argv[++i];
        } else if (!strcmp(argv[i], "--frames") && i + 1 < argc) {
            frames = strtol(argv[++i], NULL, 10);
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "kvtop replay: unexpected argument '%s' (see --help)\n", argv[i]);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        fprintf(stderr, "kvtop replay: which trace file? (kvtop replay FILE)\n");
        return 2;
    }
    kv_err err;
    kv_trace *t = kv_trace_load(path, &err);
    if (!t) {
        fprintf(stderr, "kvtop replay: %s\n", err.msg);
        return 1;
    }
    /* A recording cut off (SIGKILL) replays up to its last whole frame; say so. */
    if (kv_trace_truncated(t)) fprintf(stderr, "kvtop replay: %s\n", kv_trace_end_note(t));
    if (export_path) {
        /* No curses here: an interrupted export removes its OUT.tmp. */
        kv_cleanup_install();
        int rc = replay_export(t, path, export_path, &err);
        if (rc) fprintf(stderr, "kvtop replay: %s\n", err.msg);
        else printf("%s: %d steps -> %s\n", path, kv_trace_n_frames(t), export_path);
        kv_trace_free(t);
        return rc ? 1 : 0;
    }
    if (kv_trace_n_frames(t) == 0) {
        fprintf(stderr, "kvtop replay: %s has no steps (recording ends before the engine stepped)\n", path);
        kv_trace_free(t);
        return 1;
    }
    static app A;
    app *a = &A;
    memset(a, 0, sizeof *a);
    kv_config_default(&a->cfg);
    a->replay = t;
    a->zoom = -1;
    a->max_frames = frames > 0 ? (uint64_t)frames : 0;
    a->v.phase = KV_PHASE_REPLAY;
    a->v.focus = KV_FOCUS_PANELS;
    a->v.replay_frames = kv_trace_n_frames(t);
    a->v.template_name = "replay";
    if (app_curses_start(a)) {
        kv_trace_free(t);
        return 1;
    }
    replay_show(a);
    if (kv_trace_truncated(t))
        app_status(a, 1, "%s", kv_trace_end_note(t));
    else
        app_status(a, 0, "%s: %d steps. Left/Right step through them.", path, a->v.replay_frames);
    app_loop(a, replay_key, replay_frame);
    endwin();
    kv_trace_free(a->replay);
    a->replay = NULL;
    app_free_windows(a);
    return 0;
}
