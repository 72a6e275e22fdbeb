/* record.c - trace recording (F7, /record, `kvtop --record`): the engine
 * thread adds a frame per step through its step hook; the UI thread opens,
 * ends and exports the trace. */
#include "app_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "../profiles/profile.h"

/* The engine's step hook (engine thread): adds the step's snapshot to the
 * trace. After an error it adds nothing more; the UI thread sees rec_err
 * at its next frame and ends the recording. */
static void rec_hook(void *user, const kv_snapshot *s) {
    app *a = user;
    if (atomic_load(&a->rec_err)) return;
    int rc = kv_trace_writer_add(a->rec, s);
    if (rc < 0) atomic_store(&a->rec_err, rc);
}

/* Installs rec_hook on the engine (before it starts, for a new one).
 * 0 or the engine's error code. */
int record_attach(app *a) {
    if (!a->rec || !a->eng || a->rec_hooked) return 0;
    int rc = kv_engine_set_step_hook(a->eng, rec_hook, a);
    a->rec_hooked = rc == 0;
    return rc;
}

/* Removes the hook: on return no frame is being added. */
void record_detach(app *a) {
    if (a->rec_hooked && a->eng) kv_engine_set_step_hook(a->eng, NULL, NULL);
    a->rec_hooked = 0;
}

/* Ends the recording: the hook first, so the writer is ours alone. */
void record_stop(app *a) {
    record_detach(a);
    int frames = kv_trace_writer_frames(a->rec);
    int failed = atomic_load(&a->rec_err);
    snprintf(a->last_trace, sizeof a->last_trace, "%s", kv_trace_writer_path(a->rec));
    int rc = kv_trace_writer_close(a->rec);
    a->rec = NULL;
    a->v.recording = 0;
    atomic_store(&a->rec_err, 0);
    if (failed)
        app_status(a, 1, "trace %s: %s after %d steps, recording stopped", a->last_trace,
                   failed == KV_ERR_IO ? "write error" : kv_err_str(failed), frames);
    else if (rc) app_status(a, 1, "trace %s: write error", a->last_trace);
    else app_status(a, 0, "trace saved: %s (%d steps; kvtop replay FILE, /export FILE.json)", a->last_trace, frames);
}

void record_toggle(app *a, const char *path) {
    if (a->rec) {
        record_stop(a);
        if (!path) return;
    }
    char auto_path[1200];
    if (!path || !*path) {
        if (a->state_dir[0]) snprintf(auto_path, sizeof auto_path, "%s/%s.kvtrace", a->state_dir, a->stamp);
        else snprintf(auto_path, sizeof auto_path, "kvtop-%s.kvtrace", a->stamp);
        path = auto_path;
    }
    FILE *pf = NULL;
    char *yaml = NULL;
    size_t ylen = 0;
    pf = open_memstream(&yaml, &ylen);
    if (pf) {
        kv_profile_dump(&a->cfg, pf);
        fclose(pf);
    }
    kv_err err;
    a->rec = kv_trace_writer_open(path, yaml, &err);
    free(yaml);
    if (!a->rec) {
        app_status(a, 1, "%s", err.msg);
        return;
    }
    atomic_store(&a->rec_err, 0);
    /* NOTE: the trace starts with the next step; an idle engine adds
     * nothing, so its frame count is the number of steps recorded. */
    int rc = record_attach(a);
    if (rc) {
        kv_trace_writer_close(a->rec);
        a->rec = NULL;
        app_status(a, 1, "cannot record: %s", kv_err_str(rc));
        return;
    }
    a->v.recording = 1;
    snprintf(a->v.record_path, sizeof a->v.record_path, "%.250s", path);
    app_status(a, 0, "recording to %s (F7 stops)", path);
}

void record_export(app *a, const char *out) {
    if (a->rec) record_toggle(a, NULL);
    if (!a->last_trace[0]) {
        app_status(a, 1, "nothing recorded yet: F7 or /record starts a trace");
        return;
    }
    kv_err err;
    kv_trace *t = kv_trace_load(a->last_trace, &err);
    if (!t) {
        app_status(a, 1, "%s", err.msg);
        return;
    }
    if (replay_export(t, a->last_trace, out, &err)) app_status(a, 1, "%s", err.msg);
    else app_status(a, 0, "Chrome trace written: %s (open in ui.perfetto.dev)", out);
    kv_trace_free(t);
}
