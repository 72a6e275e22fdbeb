/* trace.c - trace files of engine snapshots: recording, loading for
 * replay, and Chrome trace-event JSON export (see trace.h). */
#include "trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/json.h"

#define TRACE_MAGIC "KVTRACE1"
#define TRACE_VERSION 1u
#define FRAME_MAGIC 0x4d415246u /* "FRAM" little-endian */
#define MAX_COUNT (1u << 24)    /* any array longer than this is a corrupt file */
#define N_ARRAYS 8

struct kv_trace_writer {
    FILE *f;
    char path[1024];
    int frames;
    int have_last;
    uint64_t last_step;
    int failed;
};

struct kv_trace {
    kv_snapshot *frames; /* (n) each with arrays owned by the trace */
    int n, cap;
    char *profile;       /* NUL-terminated */
};

static void header_sizes(uint32_t sizes[6]) {
    sizes[0] = (uint32_t)sizeof(kv_snapshot);
    sizes[1] = (uint32_t)sizeof(kv_snap_request);
    sizes[2] = (uint32_t)sizeof(kv_snap_block);
    sizes[3] = (uint32_t)sizeof(kv_step_record);
    sizes[4] = (uint32_t)sizeof(kv_decision);
    sizes[5] = (uint32_t)sizeof(int64_t);
}

/* Element sizes and counts of a snapshot's arrays, in file order. */
static void array_shape(const kv_snapshot *s, void **ptrs[N_ARRAYS], size_t elem[N_ARRAYS], uint32_t count[N_ARRAYS]) {
    void **p[N_ARRAYS] = {(void **)&s->requests, (void **)&s->tables,  (void **)&s->running, (void **)&s->waiting,
                          (void **)&s->swapped,  (void **)&s->blocks,  (void **)&s->steps,   (void **)&s->decisions};
    size_t e[N_ARRAYS] = {sizeof(kv_snap_request), sizeof(int32_t),       sizeof(int64_t),     sizeof(int64_t),
                          sizeof(int64_t),         sizeof(kv_snap_block), sizeof(kv_step_record), sizeof(kv_decision)};
    int n[N_ARRAYS] = {s->n_requests, s->n_table_entries, s->n_running, s->n_waiting,
                       s->n_swapped,  s->n_blocks,        s->n_steps,   s->n_decisions};
    for (int i = 0; i < N_ARRAYS; i++) {
        ptrs[i] = p[i];
        elem[i] = e[i];
        count[i] = (*p[i] && n[i] > 0) ? (uint32_t)n[i] : 0;
    }
}

kv_trace_writer *kv_trace_writer_open(const char *path, const char *profile_yaml, kv_err *err) {
    if (!path || !*path) {
        kv_err_set(err, KV_ERR_INVAL, "trace: no file name");
        return NULL;
    }
    kv_trace_writer *w = calloc(1, sizeof *w);
    if (!w) {
        kv_err_set(err, KV_ERR_NOMEM, "trace: out of memory");
        return NULL;
    }
    snprintf(w->path, sizeof w->path, "%s", path);
    w->f = fopen(path, "wb");
    if (!w->f) {
        kv_err_set(err, KV_ERR_IO, "cannot write %s: %s", path, strerror(errno));
        free(w);
        return NULL;
    }
    uint32_t v = TRACE_VERSION, sizes[6];
    header_sizes(sizes);
    const char *prof = profile_yaml ? profile_yaml : "";
    uint32_t plen = (uint32_t)strlen(prof);
    fwrite(TRACE_MAGIC, 1, 8, w->f);
    fwrite(&v, sizeof v, 1, w->f);
    fwrite(sizes, sizeof sizes, 1, w->f);
    fwrite(&plen, sizeof plen, 1, w->f);
    fwrite(prof, 1, plen, w->f);
    if (ferror(w->f)) {
        kv_err_set(err, KV_ERR_IO, "error writing %s", path);
        fclose(w->f);
        free(w);
        return NULL;
    }
    return w;
}

int kv_trace_writer_add(kv_trace_writer *w, const kv_snapshot *s) {
    if (!w || !s) return KV_ERR_INVAL;
    if (w->failed) return KV_ERR_IO;
    if (w->have_last && s->step == w->last_step) return 0;
    void **ptrs[N_ARRAYS];
    size_t elem[N_ARRAYS];
    uint32_t count[N_ARRAYS];
    array_shape(s, ptrs, elem, count);
    uint32_t magic = FRAME_MAGIC;
    fwrite(&magic, sizeof magic, 1, w->f);
    fwrite(s, sizeof *s, 1, w->f);
    fwrite(count, sizeof count, 1, w->f);
    for (int i = 0; i < N_ARRAYS; i++)
        if (count[i]) fwrite(*ptrs[i], elem[i], count[i], w->f);
    if (ferror(w->f)) {
        w->failed = 1;
        return KV_ERR_IO;
    }
    w->have_last = 1;
    w->last_step = s->step;
    w->frames++;
    return 1;
}

int kv_trace_writer_frames(const kv_trace_writer *w) { return w ? w->frames : 0; }
const char *kv_trace_writer_path(const kv_trace_writer *w) { return w ? w->path : ""; }

int kv_trace_writer_close(kv_trace_writer *w) {
    if (!w) return 0;
    int bad = w->failed || ferror(w->f);
    if (fclose(w->f)) bad = 1;
    free(w);
    return bad ? KV_ERR_IO : 0;
}

/* ---- loading ---- */

static void frame_free(kv_snapshot *s) {
    free(s->requests);
    free(s->tables);
    free(s->running);
    free(s->waiting);
    free(s->swapped);
    free(s->blocks);
    free(s->steps);
    free(s->decisions);
}

void kv_trace_free(kv_trace *t) {
    if (!t) return;
    for (int i = 0; i < t->n; i++) frame_free(&t->frames[i]);
    free(t->frames);
    free(t->profile);
    free(t);
}

kv_trace *kv_trace_load(const char *path, kv_err *err) {
    if (!path) {
        kv_err_set(err, KV_ERR_INVAL, "trace: no file name");
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        kv_err_set(err, KV_ERR_IO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    kv_trace *t = kv_trace_load_stream(f, path, err);
    fclose(f);
    return t;
}

kv_trace *kv_trace_load_stream(FILE *f, const char *path, kv_err *err) {
    if (!f) {
        kv_err_set(err, KV_ERR_INVAL, "trace: no stream");
        return NULL;
    }
    if (!path) path = "trace";
    /* The size bounds every array before it is allocated: a corrupt count
     * must not ask for gigabytes. */
    long start = ftell(f), size = -1;
    if (start >= 0 && fseek(f, 0, SEEK_END) == 0) {
        size = ftell(f);
        fseek(f, start, SEEK_SET);
    }
    kv_trace *t = calloc(1, sizeof *t);
    if (!t) {
        kv_err_set(err, KV_ERR_NOMEM, "trace: out of memory");
        return NULL;
    }
    char magic[8];
    uint32_t ver, sizes[6], want[6], plen;
    header_sizes(want);
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, TRACE_MAGIC, 8)) {
        kv_err_set(err, KV_ERR_FORMAT, "%s: not a kvtop trace file", path);
        goto fail;
    }
    if (fread(&ver, sizeof ver, 1, f) != 1 || ver != TRACE_VERSION) {
        kv_err_set(err, KV_ERR_FORMAT, "%s: unsupported trace version", path);
        goto fail;
    }
    if (fread(sizes, sizeof sizes, 1, f) != 1 || memcmp(sizes, want, sizeof want)) {
        kv_err_set(err, KV_ERR_FORMAT, "%s: recorded by a different kvtop build (struct sizes differ)", path);
        goto fail;
    }
    if (fread(&plen, sizeof plen, 1, f) != 1 || plen > MAX_COUNT ||
        (size >= 0 && ftell(f) >= 0 && (long)plen > size - ftell(f))) {
        kv_err_set(err, KV_ERR_FORMAT, "%s: bad profile length in the header", path);
        goto fail;
    }
    t->profile = malloc((size_t)plen + 1);
    if (!t->profile) {
        kv_err_set(err, KV_ERR_NOMEM, "trace: out of memory");
        goto fail;
    }
    if (plen && fread(t->profile, 1, plen, f) != plen) {
        kv_err_set(err, KV_ERR_FORMAT, "%s: truncated header", path);
        goto fail;
    }
    t->profile[plen] = 0;
    for (;;) {
        uint32_t fm;
        size_t got = fread(&fm, 1, sizeof fm, f);
        if (got == 0 && feof(f)) break;
        if (got != sizeof fm || fm != FRAME_MAGIC) {
            kv_err_set(err, KV_ERR_FORMAT, "%s: frame %d: bad frame marker", path, t->n);
            goto fail;
        }
        if (t->n == t->cap) {
            int nc = t->cap ? t->cap * 2 : 64;
            kv_snapshot *nf = realloc(t->frames, (size_t)nc * sizeof *nf);
            if (!nf) {
                kv_err_set(err, KV_ERR_NOMEM, "trace: out of memory at frame %d", t->n);
                goto fail;
            }
            t->frames = nf;
            t->cap = nc;
        }
        kv_snapshot *s = &t->frames[t->n];
        uint32_t count[N_ARRAYS];
        if (fread(s, sizeof *s, 1, f) != 1 || fread(count, sizeof count, 1, f) != 1) {
            kv_err_set(err, KV_ERR_FORMAT, "%s: frame %d: truncated", path, t->n);
            goto fail;
        }
        /* The struct's pointers are from the recording process: clear them
         * before anything can free them. */
        s->requests = NULL, s->tables = NULL, s->running = NULL, s->waiting = NULL;
        s->swapped = NULL, s->blocks = NULL, s->steps = NULL, s->decisions = NULL;
        void **ptrs[N_ARRAYS];
        size_t elem[N_ARRAYS];
        uint32_t dummy[N_ARRAYS];
        array_shape(s, ptrs, elem, dummy);
        int bad = 0;
        for (int i = 0; i < N_ARRAYS && !bad; i++) {
            if (count[i] > MAX_COUNT) {
                bad = 1;
                kv_err_set(err, KV_ERR_FORMAT, "%s: frame %d: array %d has %u entries", path, t->n, i, count[i]);
                break;
            }
            if (!count[i]) continue;
            long pos = ftell(f);
            if (size >= 0 && pos >= 0 && (uint64_t)elem[i] * count[i] > (uint64_t)(size - pos)) {
                bad = 1;
                kv_err_set(err, KV_ERR_FORMAT, "%s: frame %d: truncated (array %d has %u entries)", path, t->n, i,
                           count[i]);
                break;
            }
            void *buf = malloc(elem[i] * count[i]);
            if (!buf) {
                bad = 1;
                kv_err_set(err, KV_ERR_NOMEM, "trace: out of memory at frame %d", t->n);
                break;
            }
            *ptrs[i] = buf;
            if (fread(buf, elem[i], count[i], f) != count[i]) {
                bad = 1;
                kv_err_set(err, KV_ERR_FORMAT, "%s: frame %d: truncated", path, t->n);
            }
        }
        if (bad) {
            frame_free(s);
            goto fail;
        }
        s->n_requests = (int)count[0];
        s->n_table_entries = (int)count[1];
        s->n_running = (int)count[2];
        s->n_waiting = (int)count[3];
        s->n_swapped = (int)count[4];
        if (count[5] || s->n_blocks < 0) s->n_blocks = (int)count[5];
        s->n_steps = (int)count[6];
        s->n_decisions = (int)count[7];
        s->cap_requests = s->n_requests, s->cap_tables = s->n_table_entries;
        s->cap_queue = KV_MAX(KV_MAX(s->n_running, s->n_waiting), s->n_swapped);
        s->cap_blocks = (int)count[5], s->cap_steps = s->n_steps, s->cap_decisions = s->n_decisions;
        /* A request's block table must lie inside the tables array. */
        for (int r = 0; r < s->n_requests; r++) {
            kv_snap_request *q = &s->requests[r];
            if (q->n_blocks < 0 || q->table_offset < 0 || q->table_offset > s->n_table_entries ||
                q->n_blocks > s->n_table_entries - q->table_offset) {
                q->n_blocks = 0;
                q->table_offset = 0;
            }
            q->wait_reason[sizeof q->wait_reason - 1] = 0;
        }
        for (int d = 0; d < s->n_decisions; d++) s->decisions[d].text[sizeof s->decisions[d].text - 1] = 0;
        s->model_name[sizeof s->model_name - 1] = 0;
        s->backend[sizeof s->backend - 1] = 0;
        t->n++;
    }
    return t;
fail:
    kv_trace_free(t);
    return NULL;
}

int kv_trace_n_frames(const kv_trace *t) { return t ? t->n : 0; }
const kv_snapshot *kv_trace_frame(const kv_trace *t, int i) { return t && i >= 0 && i < t->n ? &t->frames[i] : NULL; }
const char *kv_trace_profile(const kv_trace *t) { return t && t->profile ? t->profile : ""; }

/* ---- Chrome trace-event JSON ---- */

static const char *decision_name(kv_decision_kind k) {
    static const char *names[KV_DEC_KIND_COUNT] = {"admit", "chunk", "preempt", "swap_out", "swap_in",
                                                   "evict", "share", "cow",     "finish",   "reject",
                                                   "wait",  "cancel", "spec"};
    return (int)k >= 0 && k < KV_DEC_KIND_COUNT ? names[k] : "decision";
}

static void ev_begin(kv_json_writer *w, const char *name, const char *cat, const char *ph, double ts_ms, int tid) {
    kv_json_write_begin_object(w);
    kv_json_write_key(w, "name");
    kv_json_write_string(w, name);
    kv_json_write_key(w, "cat");
    kv_json_write_string(w, cat);
    kv_json_write_key(w, "ph");
    kv_json_write_string(w, ph);
    kv_json_write_key(w, "ts");
    kv_json_write_number(w, ts_ms * 1000.0);
    kv_json_write_key(w, "pid");
    kv_json_write_int(w, 1);
    kv_json_write_key(w, "tid");
    kv_json_write_int(w, tid);
}

static void kv_int(kv_json_writer *w, const char *k, int64_t v) {
    kv_json_write_key(w, k);
    kv_json_write_int(w, v);
}
static void kv_num(kv_json_writer *w, const char *k, double v) {
    kv_json_write_key(w, k);
    kv_json_write_number(w, v);
}

static void thread_name(kv_json_writer *w, int tid, const char *name) {
    kv_json_write_begin_object(w);
    kv_json_write_key(w, "name");
    kv_json_write_string(w, "thread_name");
    kv_json_write_key(w, "ph");
    kv_json_write_string(w, "M");
    kv_int(w, "pid", 1);
    kv_int(w, "tid", tid);
    kv_json_write_key(w, "args");
    kv_json_write_begin_object(w);
    kv_json_write_key(w, "name");
    kv_json_write_string(w, name);
    kv_json_write_end_object(w);
    kv_json_write_end_object(w);
}

int kv_trace_export_chrome(const kv_trace *t, const char *path, kv_err *err) {
    if (!t || !path) return kv_err_set(err, KV_ERR_INVAL, "trace export: nothing to export");
    FILE *f = fopen(path, "w");
    if (!f) return kv_err_set(err, KV_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    kv_json_writer w;
    kv_json_writer_init(&w, f, 0);
    kv_json_write_begin_object(&w);
    kv_json_write_key(&w, "displayTimeUnit");
    kv_json_write_string(&w, "ms");
    kv_json_write_key(&w, "traceEvents");
    kv_json_write_begin_array(&w);
    thread_name(&w, 1, "engine steps");
    thread_name(&w, 2, "scheduler decisions");
    int have_step = 0, have_dec = 0;
    uint64_t last_step = 0, last_dec = 0;
    for (int fi = 0; fi < t->n; fi++) {
        const kv_snapshot *s = &t->frames[fi];
        for (int i = 0; i < s->n_steps; i++) {
            const kv_step_record *r = &s->steps[i];
            if (have_step && r->step <= last_step) continue;
            char name[48];
            snprintf(name, sizeof name, "step %llu", (unsigned long long)r->step);
            ev_begin(&w, name, "step", "X", r->t_ms, 1);
            kv_num(&w, "dur", r->dur_ms * 1000.0);
            kv_json_write_key(&w, "args");
            kv_json_write_begin_object(&w);
            kv_int(&w, "seqs", r->n_seqs);
            kv_int(&w, "prefill_tokens", r->n_prefill_tokens);
            kv_int(&w, "decode_tokens", r->n_decode_tokens);
            kv_int(&w, "spec_tokens", r->n_spec_tokens);
            kv_int(&w, "admitted", r->n_admitted);
            kv_int(&w, "preempted", r->n_preempted);
            kv_int(&w, "finished", r->n_finished);
            kv_int(&w, "blocks_used", r->n_blocks_used);
            kv_int(&w, "waiting", r->n_waiting);
            kv_json_write_end_object(&w);
            kv_json_write_end_object(&w);
            if (r->forward_ms > 0) {
                ev_begin(&w, "forward", "forward", "X", r->t_ms, 1);
                kv_num(&w, "dur", r->forward_ms * 1000.0);
                kv_json_write_end_object(&w);
            }
            have_step = 1;
            last_step = r->step;
        }
        uint64_t threshold = last_dec;
        int had = have_dec;
        for (int i = 0; i < s->n_decisions; i++) {
            const kv_decision *d = &s->decisions[i];
            if (had && d->step <= threshold) continue;
            double ts = s->now_ms;
            for (int k = 0; k < s->n_steps; k++)
                if (s->steps[k].step == d->step) ts = s->steps[k].t_ms;
            ev_begin(&w, decision_name(d->kind), "decision", "i", ts, 2);
            kv_json_write_key(&w, "s");
            kv_json_write_string(&w, "t");
            kv_json_write_key(&w, "args");
            kv_json_write_begin_object(&w);
            kv_int(&w, "step", (int64_t)d->step);
            kv_int(&w, "req", d->req);
            kv_json_write_key(&w, "text");
            kv_json_write_string(&w, d->text);
            kv_json_write_end_object(&w);
            kv_json_write_end_object(&w);
            if (!have_dec || d->step > last_dec) last_dec = d->step;
            have_dec = 1;
        }
        /* Counters: the block pool and the queues at this frame. */
        ev_begin(&w, "kv blocks", "counter", "C", s->now_ms, 0);
        kv_json_write_key(&w, "args");
        kv_json_write_begin_object(&w);
        kv_int(&w, "used", s->blocks_used);
        kv_int(&w, "cached", s->blocks_cached);
        kv_int(&w, "free", s->blocks_free);
        kv_json_write_end_object(&w);
        kv_json_write_end_object(&w);
        ev_begin(&w, "queues", "counter", "C", s->now_ms, 0);
        kv_json_write_key(&w, "args");
        kv_json_write_begin_object(&w);
        kv_int(&w, "running", s->n_running);
        kv_int(&w, "waiting", s->n_waiting);
        kv_int(&w, "swapped", s->n_swapped);
        kv_json_write_end_object(&w);
        kv_json_write_end_object(&w);
    }
    /* Requests: each as it was in the last frame that shows it, one track
     * per session. */
    int named[64] = {0};
    int64_t *done = NULL;
    int n_done = 0, cap_done = 0;
    for (int fi = t->n - 1; fi >= 0; fi--) {
        const kv_snapshot *s = &t->frames[fi];
        for (int i = 0; i < s->n_requests; i++) {
            const kv_snap_request *q = &s->requests[i];
            int seen = 0;
            for (int k = n_done - 1; k >= 0 && !seen; k--) seen = done[k] == q->id;
            if (seen) continue;
            if (n_done == cap_done) {
                int nc = cap_done ? cap_done * 2 : 256;
                int64_t *nd = realloc(done, (size_t)nc * sizeof *nd);
                if (!nd) continue; /* out of memory: the request is skipped, not the export */
                done = nd;
                cap_done = nc;
            }
            done[n_done++] = q->id;
            int tid = 100 + (q->session >= 0 ? q->session % 10000 : 0);
            int slot = q->session >= 0 ? q->session % 64 : 0;
            if (!named[slot]) {
                char tn[48];
                snprintf(tn, sizeof tn, "session %d", q->session);
                thread_name(&w, tid, tn);
                named[slot] = 1;
            }
            char name[48];
            snprintf(name, sizeof name, "request #%lld", (long long)q->id);
            double end = q->e2e_ms >= 0 ? q->arrival_ms + q->e2e_ms : s->now_ms;
            ev_begin(&w, name, "request", "X", q->arrival_ms, tid);
            kv_num(&w, "dur", (end - q->arrival_ms) * 1000.0);
            kv_json_write_key(&w, "args");
            kv_json_write_begin_object(&w);
            kv_int(&w, "prompt_tokens", q->n_prompt);
            kv_int(&w, "generated", q->n_generated);
            kv_int(&w, "prefix_hit_tokens", q->n_prefix_hit);
            kv_int(&w, "preemptions", q->preemptions);
            kv_num(&w, "queue_ms", q->queue_ms);
            kv_num(&w, "ttft_ms", q->ttft_ms);
            kv_num(&w, "tpot_ms", q->tpot_ms);
            kv_int(&w, "finish", q->finish);
            kv_json_write_end_object(&w);
            kv_json_write_end_object(&w);
            if (q->queue_ms > 0) {
                ev_begin(&w, "queued", "request", "X", q->arrival_ms, tid);
                kv_num(&w, "dur", q->queue_ms * 1000.0);
                kv_json_write_end_object(&w);
            }
        }
    }
    free(done);
    kv_json_write_end_array(&w);
    kv_json_write_end_object(&w);
    int rc = kv_json_writer_finish(&w);
    fputc('\n', f);
    if (ferror(f)) rc = KV_ERR_IO;
    if (fclose(f)) rc = KV_ERR_IO;
    if (rc) return kv_err_set(err, KV_ERR_IO, "error writing %s", path);
    return 0;
}
