/* compare.c - two to four engines side by side (`kvtop PROFILE --compare
 * key=v1,v2`, and each station of `kvtop tour`): one engine per value,
 * built from the same profile with that one key changed through the key
 * table, each with its own app state (tab, load driver, histories: the
 * column apps, so chat.c and the panels serve them unchanged), fed the same
 * seeded workload at the same moment (F5) and every typed prompt. One
 * screen: a header with each engine's figures and their ratios to the
 * first (the figures `kvtop bench --compare` prints, engine/compare.h),
 * then a column per engine (block map, Sched, TPOT, Mem, its transcript).
 *
 * Threads: the engines share the machine's cores. Each is pinned to its
 * own share of the cores this process may use (its compute threads and its
 * engine thread are created while the UI thread carries that affinity, and
 * inherit it), with as many compute threads as cores in its share, so one
 * engine cannot starve the other; the title line says how they split. */
#include "compare.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/cpushare.h"
#include "../profiles/profile.h"
#include "compare_view.h"

typedef struct cmp_col {
    app *a;                /* this engine's app state (engine, tab, load, histories) */
    char value[256];       /* the key's value for this engine */
    char cpus[48];         /* "cpu 0-3" */
    int threads;           /* compute threads it runs */
    double t_start, t_done;/* wall s of F5 and of the workload's last reply; t_done < 0 while running */
    int n_items;           /* requests of one pass of the workload */
} cmp_col;

typedef struct cmp {
    app *ui;               /* the screen: curses, input, status, the loop */
    const char *profile;
    const char *const *sets;
    int n_sets;
    char key[128];
    int n;                 /* engines (0: none, a tour station failed) */
    cmp_col col[KV_CMP_MAX];
    char cores[320];       /* how the cores are shared, for the title */
    char error[400];       /* why there are no engines (tour) */
    int load_on;           /* bool: F5 started the workload */
    /* tour */
    const kv_tour_station *stations;
    int n_stations, station;
    /* windows for the layout they were made for */
    kv_cmp_layout built;
    int have_windows;
    WINDOW *w_title, *w_head, *w_caption, *w_input, *w_status, *w_small;
    WINDOW *w_label[KV_CMP_MAX], *w_blocks[KV_CMP_MAX], *w_sched[KV_CMP_MAX], *w_tpot[KV_CMP_MAX],
        *w_mem[KV_CMP_MAX], *w_chat[KV_CMP_MAX];
} cmp;

static app col_apps[KV_CMP_MAX]; /* large (step log rings): not on the stack */
static cmp C;

/* ---- engines ---- */

/* Frees every engine and its column state. */
static void cmp_close(cmp *c) {
    for (int j = 0; j < c->n; j++) {
        app *a = c->col[j].a;
        load_stop(a);
        kv_engine_free(a->eng); /* stops its thread */
        a->eng = NULL;
        kv_snapshot_free(a->snap);
        for (int i = 0; i < a->n_sessions; i++) {
            kv_input_history_free(a->sessions[i]->history);
            kv_session_free(a->sessions[i]);
        }
        free(a->prompt_buf);
        memset(a, 0, sizeof *a);
    }
    c->n = 0;
    c->load_on = 0;
}

/* Fills column app a for engine e (as loader_check does for the app),
 * with one tab named after the value (no autosave: no state dir). 0 or
 * KV_ERR_NOMEM. */
static int col_setup(app *a, kv_engine *e, const kv_config *cfg, const char *value) {
    memset(a, 0, sizeof *a);
    a->cfg = *cfg;
    a->eng = e;
    a->zoom = -1;
    loader_adopt(a);
    a->v.phase = KV_PHASE_READY;
    snprintf(a->v.load_msg, sizeof a->v.load_msg, "%s", a->model->name);
    a->snap = kv_snapshot_new();
    if (!a->snap || !chat_session_add(a, value)) return KV_ERR_NOMEM;
    return 0;
}

/* Builds one engine per value of spec ("key=v1,v2") from profile + sets,
 * each pinned to its share of the cores, and starts them. On failure
 * nothing stays built: 0, or a KV_ERR_* with err naming the value. */
static int cmp_open(cmp *c, const char *profile, const char *const *sets, int n_sets, const char *spec,
                    kv_err *err) {
    char buf[2048];
    const char *key, *values[KV_CMP_MAX + 1];
    int n = kv_compare_parse(spec, buf, sizeof buf, &key, values, KV_CMP_MAX, err);
    if (n < 0) return err->code ? err->code : KV_ERR_INVAL;
    if (n < 2) return kv_err_set(err, KV_ERR_INVAL, "--compare '%s': needs 2 to %d values", spec, KV_CMP_MAX);
    const char **all = calloc((size_t)n_sets + 1, sizeof *all);
    kv_config *cfgs = calloc((size_t)n, sizeof *cfgs);
    char (*assign)[512] = calloc((size_t)n, sizeof *assign);
    int rc = 0;
    if (!all || !cfgs || !assign) {
        rc = kv_err_set(err, KV_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < n_sets; i++) all[i] = sets[i];
    /* Every configuration first, so a bad value starts nothing. */
    for (int j = 0; j < n; j++) {
        snprintf(assign[j], sizeof assign[j], "%s=%s", key, values[j]);
        all[n_sets] = assign[j];
        kv_err e2;
        if (kv_profile_load_with_sets(profile, all, n_sets + 1, &cfgs[j], &e2)) {
            rc = kv_err_set(err, e2.code ? e2.code : KV_ERR_INVAL, "--compare %s: %s", assign[j], e2.msg);
            goto done;
        }
    }
    int ids[CPU_SETSIZE];
    int n_ids = kv_cpus_allowed(ids, CPU_SETSIZE);
    cpu_set_t keep;
    int have_keep = pthread_getaffinity_np(pthread_self(), sizeof keep, &keep) == 0;
    snprintf(c->key, sizeof c->key, "%.120s", key);
    for (int j = 0; j < n; j++) {
        cmp_col *col = &c->col[j];
        memset(col, 0, sizeof *col);
        col->a = &col_apps[j];
        col->t_done = -1;
        snprintf(col->value, sizeof col->value, "%.250s", values[j]);
        cpu_set_t set;
        col->threads = kv_cpu_share(ids, n_ids, j, n, &set, col->cpus, sizeof col->cpus);
        if (cfgs[j].threads <= 0 || cfgs[j].threads > col->threads) cfgs[j].threads = col->threads;
        col->threads = cfgs[j].threads;
        /* Threads made now inherit the share: the backend's workers in
         * kv_engine_new, the engine thread in kv_engine_start. */
        int pinned = have_keep && pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
        kv_err e2;
        kv_engine *e = kv_engine_new(&cfgs[j], &e2);
        int started = -1;
        if (e) {
            sigset_t old;
            app_block_signals(&old);
            started = kv_engine_start(e);
            app_restore_signals(&old);
        }
        if (pinned) pthread_setaffinity_np(pthread_self(), sizeof keep, &keep);
        if (!pinned) snprintf(col->cpus, sizeof col->cpus, "unpinned");
        if (!e || started) {
            rc = e ? kv_err_set(err, KV_ERR_BACKEND, "--compare %s: cannot start the engine thread", assign[j])
                   : kv_err_set(err, e2.code ? e2.code : KV_ERR_INVAL, "--compare %s: %s", assign[j], e2.msg);
            kv_engine_free(e);
            goto done;
        }
        c->n = j + 1; /* cmp_close frees it from here on */
        if (col_setup(col->a, e, &cfgs[j], col->value)) {
            rc = kv_err_set(err, KV_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    /* The title line's account of the cores: "2 engines share 8 cores: A cpu 0-3, B cpu 4-7". */
    int len = snprintf(c->cores, sizeof c->cores, "%d engines share %d core%s%s:", n, n_ids, n_ids == 1 ? "" : "s",
                       n > n_ids ? " (more engines than cores: some take turns on one)" : ", each pinned to its own");
    for (int j = 0; j < n && len > 0 && len < (int)sizeof c->cores; j++)
        len += snprintf(c->cores + len, sizeof c->cores - (size_t)len, "%s %c %s", j ? "," : "", 'A' + j,
                        c->col[j].cpus);
done:
    if (rc) cmp_close(c);
    free(all);
    free(cfgs);
    free(assign);
    return rc;
}

/* ---- the workload (F5): the same seeded requests to every engine ---- */

static void cmp_load_stop(cmp *c) {
    for (int j = 0; j < c->n; j++) load_stop(c->col[j].a);
    c->load_on = 0;
}

/* Submits what is due to engine j: all of it at once (bench submits a
 * burst in one go, so the two agree on what a step sees). */
static void cmp_load_tick(cmp *c, int j) {
    cmp_col *col = &c->col[j];
    app *a = col->a;
    load_state *L = &a->load;
    if (!L->drv) return;
    for (int round = 0; round < MAX_LOAD_INFLIGHT / LOAD_SUBMIT_CAP + 1; round++)
        if (load_submit_due(a) < LOAD_SUBMIT_CAP) break;
    if (col->t_done < 0 && kv_driver_remaining(L->drv) == 0 && L->n_inflight == 0) col->t_done = app_wall_s();
}

/* Starts one pass of the profile's workload on every engine at once, each
 * measured from here (metrics reset), as `kvtop bench` measures a run:
 * prompts tokenized up front, seed + item index per request. */
static void cmp_load_start(cmp *c) {
    cmp_load_stop(c);
    if (c->n == 0) return;
    kv_driver_opts o = {
        .pretokenize = 1,
        .seed_per_item = 1,
        .max_in_flight = MAX_LOAD_INFLIGHT, /* no more in flight than a column tracks */
        .session_base = KV_SESSION_LOAD_BASE,
    };
    for (int j = 0; j < c->n; j++) {
        app *a = c->col[j].a;
        kv_err err;
        a->load.drv = kv_driver_new(a->eng, &a->cfg, &o, &err);
        if (!a->load.drv) {
            app_status(c->ui, 1, "workload: %s", err.msg);
            cmp_load_stop(c);
            return;
        }
        a->load.sessions = 1;
        c->col[j].n_items = kv_driver_count(a->load.drv);
    }
    /* The same moment for all: reset, then the first submissions together. */
    double t = app_wall_s();
    for (int j = 0; j < c->n; j++) {
        kv_engine_metrics_reset(c->col[j].a->eng);
        c->col[j].t_start = t;
        c->col[j].t_done = -1;
    }
    for (int j = 0; j < c->n; j++) cmp_load_tick(c, j);
    c->load_on = 1;
    app_status(c->ui, 0, "workload: %d requests from %s to each engine at once (seed %llu); F5 stops",
               c->col[0].n_items, c->profile ? c->profile : "the defaults",
               (unsigned long long)c->col[0].a->cfg.workload.seed);
}

/* ---- tour ---- */

/* Opens station i (clamped): the engines of its comparison, the workload
 * started under them. A station whose engines cannot be built shows why. */
static void cmp_station(cmp *c, int i) {
    if (!c->n_stations) return;
    if (i < 0) i = 0;
    if (i >= c->n_stations) i = c->n_stations - 1;
    cmp_close(c);
    c->station = i;
    c->ui->slow_idx = 0;
    const kv_tour_station *s = &c->stations[i];
    c->profile = s->profile;
    c->error[0] = 0;
    kv_err err;
    if (cmp_open(c, s->profile, NULL, 0, s->compare, &err)) {
        snprintf(c->error, sizeof c->error, "station %d (%.40s) did not start: %.300s", i + 1, s->title, err.msg);
        app_status(c->ui, 1, "%s", c->error);
        return;
    }
    cmp_load_start(c);
    c->ui->need_clear = 1; /* the model loaders may have written to the terminal */
}

/* ---- drawing ---- */

static void free_windows(cmp *c) {
    WINDOW **one[] = {&c->w_title, &c->w_head, &c->w_caption, &c->w_input, &c->w_status, &c->w_small};
    for (size_t i = 0; i < KV_ARRAY_LEN(one); i++) {
        if (*one[i]) delwin(*one[i]);
        *one[i] = NULL;
    }
    for (int j = 0; j < KV_CMP_MAX; j++) {
        WINDOW **w[] = {&c->w_label[j], &c->w_blocks[j], &c->w_sched[j], &c->w_tpot[j], &c->w_mem[j], &c->w_chat[j]};
        for (size_t i = 0; i < KV_ARRAY_LEN(w); i++) {
            if (*w[i]) delwin(*w[i]);
            *w[i] = NULL;
        }
    }
    c->have_windows = 0;
}

static WINDOW *mkwin(kv_rect r) { return kv_rect_visible(r) ? newwin(r.h, r.w, r.y, r.x) : NULL; }

static void build_windows(cmp *c, const kv_cmp_layout *l) {
    free_windows(c);
    c->built = *l;
    c->have_windows = 1;
    if (l->too_small) {
        c->w_small = newwin(l->rows > 0 ? l->rows : 1, l->cols > 0 ? l->cols : 1, 0, 0);
        return;
    }
    c->w_title = mkwin(l->title);
    c->w_head = mkwin(l->head);
    c->w_caption = mkwin(l->caption);
    c->w_input = mkwin(l->input);
    c->w_status = mkwin(l->status);
    for (int j = 0; j < l->n; j++) {
        c->w_label[j] = mkwin(l->label[j]);
        c->w_blocks[j] = mkwin(l->blocks[j]);
        c->w_sched[j] = mkwin(l->sched[j]);
        c->w_tpot[j] = mkwin(l->tpot[j]);
        c->w_mem[j] = mkwin(l->mem[j]);
        c->w_chat[j] = mkwin(l->chat[j]);
    }
}

/* Text at (y, x) cut to the window's width. */
static void put(WINDOW *w, int y, int x, attr_t a, const char *s) {
    int h, wd;
    getmaxyx(w, h, wd);
    if (y >= h || x >= wd) return;
    wattrset(w, a);
    mvwaddnstr(w, y, x, s, wd - x);
    wattrset(w, A_NORMAL);
}

static attr_t title_attr(const kv_view_state *v) { return v->color ? (COLOR_PAIR(KV_PAIR_TITLE) | A_BOLD) : A_BOLD; }

/* The title row: key, values, cores; the ratio table under it. */
static void draw_head(cmp *c) {
    const kv_view_state *v = &c->ui->v;
    char t[600];
    int n = snprintf(t, sizeof t, " kvtop --compare %s:", c->key);
    for (int j = 0; j < c->n && n < (int)sizeof t; j++)
        n += snprintf(t + n, sizeof t - (size_t)n, " %s%s", j ? "| " : "", c->col[j].value);
    if (n < (int)sizeof t) snprintf(t + n, sizeof t - (size_t)n, "   %s", c->cores);
    /* narrow: each column's share alone ("A cpu 0, B cpu 1") */
    if ((int)strlen(t) > getmaxx(c->w_title))
        for (int j = 0; j < c->n && n < (int)sizeof t; j++)
            n += snprintf(t + n, sizeof t - (size_t)n, "%s%c %s", j ? ", " : "   ", 'A' + j, c->col[j].cpus);
    werase(c->w_title);
    put(c->w_title, 0, 0, title_attr(v), t);
    WINDOW *w = c->w_head;
    if (!w) return;
    werase(w);
    /* Speculative acceptance only where some engine speculates. */
    int spec = 0;
    for (int j = 0; j < c->n; j++) spec |= c->col[j].a->cfg.spec.method != KV_SPEC_OFF;
    int n_metrics = spec ? KV_CMP_HEADER_COUNT : KV_CMP_SPEC_ACC;
    /* as many figures a line as the width takes; the rest wrap to a group
     * of lines below (names, then a row per engine) */
    int per = kv_cmp_head_per_line(getmaxx(w));
    const kv_metrics_summary *m0 = c->col[0].a->shown ? &c->col[0].a->shown->metrics : NULL;
    for (int g = 0; g * per < n_metrics; g++) {
        int y0 = g * (1 + c->n);
        put(w, y0, 0, A_DIM, g ? "" : c->load_on ? " since F5" : " F5 to start");
        for (int k = g * per; k < n_metrics && k < (g + 1) * per; k++) {
            char h[32];
            snprintf(h, sizeof h, "%s%s", kv_compare_metric_name((kv_cmp_metric)k),
                     k == KV_CMP_TTFT50 || k == KV_CMP_TTFT99 ? " ms" : "");
            put(w, y0, KV_CMP_NAME_W + (k - g * per) * KV_CMP_CELL_W, A_BOLD, h);
        }
        for (int j = 0; j < c->n; j++) {
            const app *a = c->col[j].a;
            char name[64];
            snprintf(name, sizeof name, " %c %.15s", 'A' + j, c->col[j].value);
            put(w, y0 + 1 + j, 0, A_BOLD, name);
            const kv_metrics_summary *m = a->shown ? &a->shown->metrics : NULL;
            for (int k = g * per; k < n_metrics && k < (g + 1) * per; k++) {
                char cell[48];
                if (!m || !m0) snprintf(cell, sizeof cell, "N/A");
                else kv_cmp_cell(cell, sizeof cell, m0, m, (kv_cmp_metric)k, j == 0);
                put(w, y0 + 1 + j, KV_CMP_NAME_W + (k - g * per) * KV_CMP_CELL_W, A_NORMAL, cell);
            }
        }
    }
}

/* One row over column j: its value, cores, threads, the workload's state. */
static void draw_label(cmp *c, int j) {
    cmp_col *col = &c->col[j];
    WINDOW *w = c->w_label[j];
    if (!w) return;
    werase(w);
    char t[400], st[96] = "";
    const app *a = col->a;
    if (a->load.drv) {
        int left = kv_driver_remaining(a->load.drv);
        if (col->t_done >= 0)
            snprintf(st, sizeof st, "workload done in %.1f s", col->t_done - col->t_start);
        else
            snprintf(st, sizeof st, "workload %d/%d sent, %d in flight", col->n_items - left, col->n_items,
                     a->load.n_inflight);
    }
    snprintf(t, sizeof t, " %c %s=%s  %s, %d thread%s  %s", 'A' + j, c->key, col->value, col->cpus, col->threads,
             col->threads == 1 ? "" : "s", st);
    put(w, 0, 0, A_REVERSE | A_BOLD, t);
    int h, wd;
    getmaxyx(w, h, wd);
    (void)h;
    int len = (int)strlen(t);
    if (len < wd) {
        wattrset(w, A_REVERSE);
        mvwhline(w, 0, len, ' ', wd - len);
        wattrset(w, A_NORMAL);
    }
}

/* Column j's view state: the app's copies, the screen's settings, and
 * its chat rectangles (the latency line sits on the transcript's bottom
 * border, where the separator above the input would be). */
static void col_view(cmp *c, const kv_cmp_layout *l, int j) {
    app *a = c->col[j].a;
    app_view_sync(a);
    kv_view_state *v = &a->v;
    const kv_view_state *u = &c->ui->v;
    v->color = u->color;
    v->utf8 = u->utf8;
    v->focus = KV_FOCUS_PANELS; /* the columns have no input of their own */
    v->fill_marks = u->fill_marks;
    kv_rect r = l->chat[j];
    v->layout.panels[KV_PANEL_CHAT] = r;
    v->layout.transcript = (kv_rect){r.y + 1, r.x + 1, r.h > 2 ? r.h - 2 : 0, r.w > 2 ? r.w - 2 : 0};
    v->layout.input = (kv_rect){r.y + r.h, r.x + 1, 1, r.w > 2 ? r.w - 2 : 0};
}

static void draw_status(cmp *c) {
    WINDOW *w = c->w_status;
    if (!w) return;
    kv_view_state *v = &c->ui->v;
    werase(w);
    if (v->status[0] && app_wall_s() > c->ui->status_until) v->status[0] = 0;
    char hint[256];
    snprintf(hint, sizeof hint, "Enter: prompt to every engine  F5 workload  F2 pause  F3 step  F4 slow  F9 fill/owner  F8 colors%s  ^C quit",
             c->n_stations ? "  F12/F11 next/previous station" : "");
    attr_t a = v->status[0] && v->status_error ? (v->color ? COLOR_PAIR(KV_PAIR_ERROR) : 0) | A_BOLD : A_NORMAL;
    put(w, 0, 0, a, v->status[0] ? v->status : hint);
    char right[64];
    snprintf(right, sizeof right, " ui %.1f%% cpu %.0f fps ", v->ui_cpu_pct, v->fps);
    int h, wd;
    getmaxyx(w, h, wd);
    (void)h;
    int rw = (int)strlen(right);
    if (rw < wd / 3) put(w, 0, wd - rw, A_DIM, right);
}

static void cmp_draw(cmp *c) {
    app *ui = c->ui;
    int rows, cols;
    getmaxyx(stdscr, rows, cols);
    kv_input_view_get(&ui->v.input);
    kv_cmp_layout l;
    int n = c->n > 0 ? c->n : 1;
    if (kv_cmp_layout_compute(cols, rows, n, c->n_stations > 0, &l)) return;
    if (!c->have_windows || memcmp(&c->built, &l, sizeof l)) {
        build_windows(c, &l);
        ui->need_clear = 1;
    }
    if (ui->need_clear) {
        clearok(curscr, TRUE);
        ui->need_clear = 0;
    }
    if (l.too_small) {
        werase(c->w_small);
        char m[160];
        snprintf(m, sizeof m, "kvtop --compare needs at least %dx%d for %d engines (this terminal is %dx%d)",
                 KV_CMP_MIN_COL * n > KV_LAYOUT_MIN_COLS ? KV_CMP_MIN_COL * n : KV_LAYOUT_MIN_COLS, KV_LAYOUT_MIN_ROWS,
                 n, cols, rows);
        put(c->w_small, 0, 0, A_BOLD, m);
        wnoutrefresh(c->w_small);
        doupdate();
        return;
    }
    if (c->n > 0) {
        draw_head(c);
    } else {
        werase(c->w_title);
        werase(c->w_head);
        put(c->w_title, 0, 0, title_attr(&ui->v), " kvtop tour");
        put(c->w_head, 1, 1, A_BOLD, c->error[0] ? c->error : "no engines");
    }
    if (c->w_caption) {
        const kv_tour_station *s = &c->stations[c->station];
        char t[600];
        snprintf(t, sizeof t, " %d/%d %s: %s", c->station + 1, c->n_stations, s->title, s->caption);
        werase(c->w_caption);
        put(c->w_caption, 0, 0, ui->v.color ? COLOR_PAIR(KV_PAIR_OK) | A_BOLD : A_BOLD, t);
    }
    WINDOW *top[] = {c->w_title, c->w_head, c->w_caption};
    for (size_t i = 0; i < KV_ARRAY_LEN(top); i++)
        if (top[i]) wnoutrefresh(top[i]);
    for (int j = 0; j < c->n; j++) {
        col_view(c, &l, j);
        const app *a = c->col[j].a;
        const kv_view_state *v = &a->v;
        draw_label(c, j);
        struct {
            WINDOW *w;
            kv_panel_fn fn;
        } p[] = {{c->w_blocks[j], kv_panel_blocks}, {c->w_sched[j], kv_panel_sched}, {c->w_tpot[j], kv_panel_tpot},
                 {c->w_mem[j], kv_panel_mem},       {c->w_chat[j], kv_panel_chat}};
        if (c->w_label[j]) wnoutrefresh(c->w_label[j]);
        for (size_t i = 0; i < KV_ARRAY_LEN(p); i++) {
            if (!p[i].w) continue;
            p[i].fn(p[i].w, v, a->shown);
            wnoutrefresh(p[i].w);
        }
    }
    draw_status(c);
    if (c->w_status) wnoutrefresh(c->w_status);
    if (c->w_input) {
        int cy = 0, cx = 0;
        ui->v.input.prompt = "all> ";
        kv_panel_input(c->w_input, &ui->v, &cy, &cx);
        wmove(c->w_input, cy, cx);
        wnoutrefresh(c->w_input);
        curs_set(ui->v.focus == KV_FOCUS_INPUT ? 1 : 0);
    }
    doupdate();
}

/* The loop's redraw between frames (after keys, after a resume). */
static void cmp_redraw(app *ui) {
    (void)ui;
    cmp_draw(&C);
}

/* ---- each frame ---- */

static void cmp_frame(app *ui) {
    cmp *c = &C;
    for (int j = 0; j < c->n; j++) {
        app *a = c->col[j].a;
        chat_poll_events(a);
        cmp_load_tick(c, j);
        if (kv_engine_snapshot(a->eng, a->snap) == 0) {
            a->have_snap = 1;
            app_after_snapshot(a, a->snap);
        }
        a->shown = a->have_snap ? a->snap : NULL;
        for (int i = 0; i < a->n_forget; i++) kv_engine_forget(a->eng, a->forget[i]);
        a->n_forget = 0;
    }
    cmp_draw(c);
    ui->v.frames++;
    app_update_cpu(ui);
}

/* ---- keys and lines ---- */

static void cmp_pause(cmp *c, int on) {
    c->ui->paused = on;
    for (int j = 0; j < c->n; j++) {
        app *a = c->col[j].a;
        a->paused = on;
        if (on) kv_engine_pause(a->eng);
        else kv_engine_resume(a->eng);
    }
    app_status(c->ui, 0, on ? "all engines paused (F2 resumes, F3 steps each once)" : "running");
}

static int any_reply(const cmp *c) {
    for (int j = 0; j < c->n; j++)
        if (c->col[j].a->n_sessions && c->col[j].a->sessions[0]->req) return 1;
    return 0;
}

/* A slash command, or a prompt for every engine's tab. */
static void cmp_command(cmp *c, const kv_command *k) {
    switch (k->kind) {
    case KV_CMD_NONE:
        if (c->n == 0) {
            app_status(c->ui, 1, "no engines here");
            break;
        }
        if (any_reply(c)) {
            app_status(c->ui, 1, "a reply is still coming: Esc cancels it on every engine");
            break;
        }
        for (int j = 0; j < c->n; j++) chat_send_prompt(c->col[j].a, c->col[j].a->sessions[0], k->prompt);
        break;
    case KV_CMD_QUIT: c->ui->quit = 1; break;
    case KV_CMD_PAUSE: cmp_pause(c, !c->ui->paused); break;
    case KV_CMD_INJECT:
        if (k->has_num && k->num == 0) cmp_load_stop(c);
        else cmp_load_start(c);
        break;
    case KV_CMD_CLEAR:
    case KV_CMD_MAX:
    case KV_CMD_TEMP:
    case KV_CMD_SEED:
        for (int j = 0; j < c->n; j++) {
            app *a = c->col[j].a;
            kv_session *s = a->sessions[0];
            if (k->kind == KV_CMD_CLEAR) {
                if (s->req) kv_engine_cancel(a->eng, s->req);
                kv_session_clear(s);
            } else if (k->kind == KV_CMD_MAX) {
                s->max_tokens = (int)k->num;
            } else if (k->kind == KV_CMD_TEMP) {
                s->sampling.temperature = (float)k->num;
            } else {
                s->sampling.seed = (uint64_t)k->num;
            }
        }
        app_status(c->ui, 0, "every engine's tab: %s", k->kind == KV_CMD_CLEAR ? "cleared" : "set");
        break;
    default:
        app_status(c->ui, 1, "side by side, the commands are /max /temp /seed /clear /pause /inject /quit");
        break;
    }
}

static void cmp_on_line(char *line, void *ctx) {
    cmp *c = ctx;
    if (!line) {
        c->ui->quit = 1;
        return;
    }
    const char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (*p) {
        kv_input_history_add(line);
        kv_command k;
        char msg[256];
        if (kv_command_parse(line, &k, msg, sizeof msg)) app_status(c->ui, 1, "%s", msg);
        else cmp_command(c, &k);
    }
    free(line);
}

static void cmp_key(app *ui, kv_key k) {
    cmp *c = &C;
    if (c->n_stations && !k.alt &&
        (k.code == KV_KEY_F(12) || k.code == KV_KEY_F(11) ||
         (ui->v.focus == KV_FOCUS_PANELS && (k.code == 'n' || k.code == 'b')))) {
        int next = k.code == KV_KEY_F(12) || k.code == 'n';
        app_status(ui, 0, "loading station %d ...", c->station + (next ? 2 : 0));
        cmp_draw(c); /* the message shows while the models load */
        cmp_station(c, c->station + (next ? 1 : -1));
        return;
    }
    kv_key_ctx ctx = {ui->v.focus, kv_input_empty(), any_reply(c), 0, 0, 10};
    kv_action act = kv_keys_map(k, &ctx);
    switch (act.type) {
    case KV_ACT_INPUT: kv_input_feed(k); break;
    case KV_ACT_QUIT: ui->quit = 1; break;
    case KV_ACT_PAUSE: cmp_pause(c, !ui->paused); break;
    case KV_ACT_STEP:
        if (!ui->paused) cmp_pause(c, 1);
        for (int j = 0; j < c->n; j++) kv_engine_step_once(c->col[j].a->eng);
        break;
    case KV_ACT_SLOW: {
        /* Slow motion on every engine alike: off, 20, 100, 500 ms a step. */
        static const int delays[] = {0, 20, 100, 500};
        ui->slow_idx = (ui->slow_idx + 1) % (int)KV_ARRAY_LEN(delays);
        for (int j = 0; j < c->n; j++) kv_engine_set_step_delay(c->col[j].a->eng, delays[ui->slow_idx]);
        app_status(ui, 0, "slow motion: %d ms after each step, every engine", delays[ui->slow_idx]);
        break;
    }
    case KV_ACT_LOAD:
        if (c->load_on) {
            cmp_load_stop(c);
            app_status(ui, 0, "workload stopped");
        } else {
            cmp_load_start(c);
        }
        break;
    case KV_ACT_FILL:
        ui->v.fill_marks = !ui->v.fill_marks;
        app_status(ui, 0, "block maps: %s", ui->v.fill_marks ? "fill of each block" : "owner of each block");
        break;
    case KV_ACT_THEME:
        if (ui->color_ok) ui->v.color = !ui->v.color;
        break;
    case KV_ACT_CANCEL:
        for (int j = 0; j < c->n; j++) {
            app *a = c->col[j].a;
            if (a->sessions[0]->req) chat_cancel(a, a->sessions[0]);
        }
        break;
    case KV_ACT_FOCUS_TOGGLE: ui->v.focus = ui->v.focus == KV_FOCUS_INPUT ? KV_FOCUS_PANELS : KV_FOCUS_INPUT; break;
    case KV_ACT_FOCUS_INPUT: ui->v.focus = KV_FOCUS_INPUT; break;
    case KV_ACT_SCROLL:
    case KV_ACT_SCROLL_END:
        for (int j = 0; j < c->n; j++) {
            kv_session *s = c->col[j].a->sessions[0];
            s->scroll = act.type == KV_ACT_SCROLL_END ? 0 : s->scroll + act.arg;
            if (s->scroll < 0) s->scroll = 0;
        }
        break;
    case KV_ACT_HELP:
        app_status(ui, 0, "F5 workload (same requests to every engine)  Enter prompt to all  F2/F3 pause/step  F9 fill  "
                          "Esc cancel  Tab panels  ^C quit");
        break;
    case KV_ACT_REDRAW:
    case KV_ACT_RESIZE: ui->need_clear = 1; break;
    case KV_ACT_SUSPEND:
        app_suspend(ui);
        ui->need_clear = 1;
        break;
    default: break;
    }
}

/* ---- entry ---- */

int cmp_main(app *ui, const char *profile, const char *const *sets, int n_sets, const char *spec,
             const kv_tour_station *stations, int n_stations, int first) {
    cmp *c = &C;
    memset(c, 0, sizeof *c);
    c->ui = ui;
    c->profile = profile;
    c->sets = sets;
    c->n_sets = n_sets;
    c->stations = stations;
    c->n_stations = n_stations;
    ui->v.fill_marks = 1; /* what a comparison is for: reservation against use */
    ui->redraw = cmp_redraw;
    ui->v.focus = KV_FOCUS_INPUT;
    ui->v.phase = KV_PHASE_READY; /* the engines are built before the screen comes up */
    kv_err err;
    if (n_stations > 0) {
        /* The first station must come up, so a broken checkout fails here. */
        c->station = first < 0 ? 0 : first >= n_stations ? n_stations - 1 : first;
        const kv_tour_station *s = &stations[c->station];
        c->profile = s->profile;
        if (cmp_open(c, s->profile, NULL, 0, s->compare, &err)) {
            fprintf(stderr, "kvtop tour: station %d (%s): %s\n", c->station + 1, s->title, err.msg);
            return 2;
        }
    } else if (cmp_open(c, profile, sets, n_sets, spec, &err)) {
        fprintf(stderr, "kvtop: %s\n", err.msg);
        return 2;
    }
    if (app_curses_start(ui)) {
        cmp_close(c);
        return 1;
    }
    if (kv_input_init(cmp_on_line, c)) {
        endwin();
        fprintf(stderr, "kvtop: readline did not start\n");
        cmp_close(c);
        return 1;
    }
    if (n_stations > 0) cmp_load_start(c);
    else
        app_status(ui, 0, "%d engines on %s, one key apart: F5 sends them the same workload, Enter the same prompt",
                   c->n, profile ? profile : "the defaults");
    app_loop(ui, cmp_key, cmp_frame);
    endwin();
    /* 1 when a terminal signal ended it (as cmd_tui) */
    int rc = ui->quit || (ui->max_frames && ui->v.frames >= ui->max_frames) ? 0 : 1;
    cmp_close(c);
    free_windows(c);
    kv_input_shutdown();
    return rc;
}
