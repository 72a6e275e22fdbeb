/* trace.c - trace files of engine snapshots: recording (one delta-encoded
 * frame per engine step), loading for replay (frames materialised on
 * demand from the nearest keyframe); the Chrome trace-event JSON export is
 * trace_export.c (see trace.h for the format). Reads and writes only
 * engine types, so every front end shares one copy. */
#include "trace.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/vec.h"

#define TRACE_MAGIC "KVTRACE1"
#define TRACE_VERSION 2u
#define FRAME_MAGIC 0x4d415246u /* "FRAM" little-endian */
#define MAX_COUNT (1u << 24)    /* any array longer than this is a corrupt file */
#define KEY_MIN_GAP 64          /* frames between forced keyframes, at least */
#define FLAG_RESET 1u           /* frame flag: the step history starts over */

/* The delta-encoded arrays of a frame, in file order. A_HEAD is the
 * kv_snapshot struct as 8-byte words, so its scalars (counters, metrics)
 * are delta-encoded like the arrays. */
enum { A_HEAD, A_REQ, A_TAB, A_RUN, A_WAIT, A_SWAP, A_BLOCK, N_ARR };
#define HEAD_WORDS ((sizeof(kv_snapshot) + 7) / 8)

static const size_t arr_elem[N_ARR] = {8, sizeof(kv_snap_request), sizeof(int32_t), sizeof(int64_t),
                                       sizeof(int64_t), sizeof(int64_t), sizeof(kv_snap_block)};

/* One array as the writer last wrote it (= as the loader rebuilds it). */
typedef struct mirror {
    unsigned char *v; /* (cap, arr_elem) */
    uint32_t n, cap;
} mirror;

struct kv_trace_writer {
    FILE *f;
    char path[1024];
    atomic_int frames;      /* read by other threads (kv_trace_writer_frames) */
    int failed;             /* bool: a write failed; the file ends in a partial frame */
    int have_last;          /* bool: a frame was written */
    uint64_t last_step;     /* its step */
    int restart;            /* bool: the next frame comes from a new engine (kv_trace_writer_restart) */
    int have_rec;           /* bool: step records were written (since the last reset) */
    uint64_t rec_step;      /* the newest one's step */
    int have_dec;           /* bool: decisions were written (since the last reset) */
    uint64_t dec_step;      /* the newest one's step */
    int dec_at_step;        /* decisions of dec_step written */
    int since_key;          /* frames written since the last keyframe */
    uint64_t key_bytes;     /* array bytes of the last keyframe */
    uint64_t delta_bytes;   /* array bytes of the frames since */
    mirror prev[N_ARR];     /* every array after the last frame */
    uint32_t *chg;          /* (cap_chg) changed indices of the array being written */
    uint32_t cap_chg;
    union {                 /* the snapshot struct being written, pointers cleared */
        kv_snapshot s;
        uint64_t w[HEAD_WORDS];
    } head;
};

/* One array of a loaded frame: where its section lies in the frame's blob. */
typedef struct trace_arr {
    uint32_t count;   /* the array's length at this frame */
    uint32_t n_items; /* full: count; delta: (index, element) pairs */
    uint8_t full;     /* bool */
    size_t off;       /* its payload in blob */
} trace_arr;

typedef struct trace_frame {
    unsigned char *blob;  /* the seven array payloads as in the file (owned) */
    trace_arr a[N_ARR];
    int key;              /* the keyframe this frame is rebuilt from (itself when one) */
    size_t steps_base;    /* t->steps[steps_base, steps_end): the history up to this frame */
    size_t steps_end;
    size_t dec_base, dec_end; /* likewise in t->decisions */
} trace_frame;

struct kv_trace {
    trace_frame *frames;  /* (cap) */
    int n, cap;
    kv_step_record *steps; /* (cap_steps) every step record once, in file order */
    size_t n_steps, cap_steps;
    kv_decision *decisions; /* (cap_dec) every decision once */
    size_t n_dec, cap_dec;
    char *profile;        /* NUL-terminated */
    /* materialisation: the arrays of frame `at`, sized at load for the
     * largest frame so kv_trace_frame never allocates */
    unsigned char *cur[N_ARR]; /* (max_n[a], arr_elem[a]) */
    uint32_t cur_n[N_ARR];
    uint32_t max_n[N_ARR];
    int at;               /* frame in cur, -1 none */
    int shown;            /* frame last returned by kv_trace_frame, -1 none */
    kv_snap_request *view_req; /* (max_n[A_REQ]) requests with their tables clamped */
    kv_snapshot view;     /* what kv_trace_frame returns */
    int truncated;        /* bool: the file ends inside a frame (kv_trace_truncated) */
    char end_note[1200];  /* how it ends when truncated, "" otherwise */
};

static void header_sizes(uint32_t sizes[6]) {
    sizes[0] = (uint32_t)sizeof(kv_snapshot);
    sizes[1] = (uint32_t)sizeof(kv_snap_request);
    sizes[2] = (uint32_t)sizeof(kv_snap_block);
    sizes[3] = (uint32_t)sizeof(kv_step_record);
    sizes[4] = (uint32_t)sizeof(kv_decision);
    sizes[5] = (uint32_t)sizeof(int64_t);
}

/* ---- writing ---- */

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
    atomic_init(&w->frames, 0);
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

static void put_u32(FILE *f, uint32_t x) { fwrite(&x, sizeof x, 1, f); }

/* The snapshot's arrays (pointers and counts) in file order; a NULL array
 * or a negative count is an empty array. */
static void writer_sources(kv_trace_writer *w, const kv_snapshot *s, const void *src[N_ARR], uint32_t n[N_ARR]) {
    const void *p[N_ARR] = {w->head.w, s->requests, s->tables, s->running, s->waiting, s->swapped, s->blocks};
    int c[N_ARR] = {(int)HEAD_WORDS, s->n_requests, s->n_table_entries, s->n_running, s->n_waiting,
                    s->n_swapped, s->n_blocks};
    for (int a = 0; a < N_ARR; a++) {
        src[a] = p[a];
        n[a] = p[a] && c[a] > 0 ? (uint32_t)c[a] : 0;
    }
}

/* Writes array a of the frame (count, mode, payload) as a delta against
 * the mirror when that is smaller (and force is 0), and updates the
 * mirror. Adds the bytes written to *bytes; returns 1 when it went in
 * full. */
static int write_array(kv_trace_writer *w, int a, const void *src, uint32_t n, int force, uint64_t *bytes) {
    mirror *m = &w->prev[a];
    const size_t el = arr_elem[a];
    const unsigned char *s = src;
    uint32_t n_chg = 0;
    if (!force) {
        uint32_t common = KV_MIN(n, m->n);
        for (uint32_t i = 0; i < common; i++)
            if (memcmp(s + i * el, m->v + i * el, el)) w->chg[n_chg++] = i;
        for (uint32_t i = common; i < n; i++) w->chg[n_chg++] = i; /* grown: always written */
    }
    int full = force || (uint64_t)n * el <= 4 + (uint64_t)n_chg * (4 + el);
    put_u32(w->f, n);
    put_u32(w->f, full ? 0 : 1);
    *bytes += 8 + (full ? (uint64_t)n * el : 4 + (uint64_t)n_chg * (4 + el));
    if (full) {
        if (n) fwrite(s, el, n, w->f);
    } else {
        put_u32(w->f, n_chg);
        for (uint32_t k = 0; k < n_chg; k++) {
            put_u32(w->f, w->chg[k]);
            fwrite(s + (size_t)w->chg[k] * el, el, 1, w->f);
        }
    }
    if (n) memcpy(m->v, s, (size_t)n * el);
    m->n = n;
    return full;
}

int kv_trace_writer_add(kv_trace_writer *w, const kv_snapshot *s) {
    if (!w || !s) return KV_ERR_INVAL;
    if (w->failed) return KV_ERR_IO;
    if (w->have_last && s->step == w->last_step && !w->restart) return 0;
    int reset = w->have_last && (s->step < w->last_step || w->restart);

    /* The struct as it is stored (byte for byte, padding too: a copy by
     * assignment may leave it out): what the pointers and capacities held
     * means nothing in another process. */
    kv_snapshot *c = &w->head.s;
    memset(&w->head, 0, sizeof w->head);
    memcpy(c, s, sizeof *s);
    c->requests = NULL, c->tables = NULL, c->running = NULL, c->waiting = NULL;
    c->swapped = NULL, c->blocks = NULL, c->steps = NULL, c->decisions = NULL;
    c->cap_requests = c->cap_tables = c->cap_queue = c->cap_blocks = c->cap_steps = c->cap_decisions = 0;
    const void *src[N_ARR];
    uint32_t n[N_ARR], most = 0;
    writer_sources(w, s, src, n);

    /* Everything that can fail to allocate first: nothing is written then. */
    for (int a = 0; a < N_ARR; a++) {
        mirror *m = &w->prev[a];
        size_t cap = m->cap;
        if (kv_grow_size((void **)&m->v, &cap, n[a], arr_elem[a])) return KV_ERR_NOMEM;
        m->cap = (uint32_t)cap;
        most = KV_MAX(most, n[a]);
    }
    size_t cap_chg = w->cap_chg;
    if (kv_grow_size((void **)&w->chg, &cap_chg, most, sizeof *w->chg)) return KV_ERR_NOMEM;
    w->cap_chg = (uint32_t)cap_chg;

    /* New step records: newer than the newest written. New decisions: of
     * newer steps, plus those of the newest written step beyond the ones
     * already written (counted from the end: the ring drops the oldest). */
    int have_rec = w->have_rec && !reset, have_dec = w->have_dec && !reset;
    int n_st = s->steps && s->n_steps > 0 ? s->n_steps : 0;
    int n_dc = s->decisions && s->n_decisions > 0 ? s->n_decisions : 0;
    int new_st = 0;
    while (new_st < n_st && (!have_rec || s->steps[n_st - 1 - new_st].step > w->rec_step)) new_st++;
    int new_dc = 0, same = 0;
    while (new_dc < n_dc && (!have_dec || s->decisions[n_dc - 1 - new_dc].step > w->dec_step)) new_dc++;
    if (have_dec) {
        while (new_dc + same < n_dc && s->decisions[n_dc - 1 - new_dc - same].step == w->dec_step) same++;
        if (same > w->dec_at_step) new_dc += same - w->dec_at_step;
    }

    put_u32(w->f, FRAME_MAGIC);
    put_u32(w->f, reset ? FLAG_RESET : 0);
    put_u32(w->f, (uint32_t)new_st);
    put_u32(w->f, (uint32_t)new_dc);
    if (new_st) fwrite(s->steps + n_st - new_st, sizeof *s->steps, (size_t)new_st, w->f);
    if (new_dc) fwrite(s->decisions + n_dc - new_dc, sizeof *s->decisions, (size_t)new_dc, w->f);
    /* NOTE: a keyframe is forced once both KEY_MIN_GAP frames and as many
     * delta bytes as the last keyframe came since it, rather than every
     * KEY_MIN_GAP frames: a big block map (the default profile's 26k blocks
     * are 420 KB) would otherwise dominate the file, while a frame is
     * still rebuilt from at most about twice a keyframe's bytes. */
    int force = !w->have_last || (w->since_key >= KEY_MIN_GAP - 1 && w->delta_bytes >= w->key_bytes);
    int all_full = 1;
    uint64_t bytes = 0;
    for (int a = 0; a < N_ARR; a++) all_full &= write_array(w, a, src[a], n[a], force, &bytes);
    if (ferror(w->f)) {
        w->failed = 1;
        return KV_ERR_IO;
    }

    w->have_last = 1;
    w->restart = 0;
    w->last_step = s->step;
    if (reset) w->have_rec = w->have_dec = 0;
    if (new_st) {
        w->have_rec = 1;
        w->rec_step = s->steps[n_st - 1].step;
    }
    if (new_dc) {
        /* Every decision of the newest step in this snapshot is written now. */
        uint64_t newest = s->decisions[n_dc - 1].step;
        int k = 0;
        while (k < n_dc && s->decisions[n_dc - 1 - k].step == newest) k++;
        w->have_dec = 1;
        w->dec_step = newest;
        w->dec_at_step = k;
    } else if (have_dec && same < w->dec_at_step) {
        w->dec_at_step = same; /* the ring dropped some: count what it still shows */
    }
    w->since_key = all_full ? 0 : w->since_key + 1;
    if (all_full) w->key_bytes = bytes, w->delta_bytes = 0;
    else w->delta_bytes += bytes;
    atomic_fetch_add(&w->frames, 1);
    return 1;
}

void kv_trace_writer_restart(kv_trace_writer *w) {
    if (w && w->have_last) w->restart = 1;
}

int kv_trace_writer_frames(const kv_trace_writer *w) {
    return w ? atomic_load((atomic_int *)&w->frames) : 0;
}
const char *kv_trace_writer_path(const kv_trace_writer *w) { return w ? w->path : ""; }

int kv_trace_writer_close(kv_trace_writer *w) {
    if (!w) return 0;
    int bad = w->failed || ferror(w->f);
    if (fclose(w->f)) bad = 1;
    for (int a = 0; a < N_ARR; a++) free(w->prev[a].v);
    free(w->chg);
    free(w);
    return bad ? KV_ERR_IO : 0;
}

/* ---- loading ---- */

void kv_trace_free(kv_trace *t) {
    if (!t) return;
    for (int i = 0; i < t->n; i++) free(t->frames[i].blob);
    free(t->frames);
    free(t->steps);
    free(t->decisions);
    free(t->profile);
    for (int a = 0; a < N_ARR; a++) free(t->cur[a]);
    free(t->view_req);
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

/* The reading state of one load. */
typedef struct loader {
    FILE *f;
    const char *path;
    long size;            /* the stream's length, -1 unknown */
    kv_err *err;
    unsigned char *buf;   /* (cap_buf) the frame being read */
    size_t cap_buf;
    uint32_t count[N_ARR]; /* every array's length after the last frame */
    int cut;              /* bool: the error set is the end of the data (a cut-off recording) */
} loader;

/* The data ended inside a frame: marks the load as cut off (the frames
 * before load) and sets the message of what was being read. Returns
 * KV_ERR_FORMAT; a read error (ferror) is KV_ERR_IO and no cut. */
static int __attribute__((format(printf, 2, 3))) cut_off(loader *L, const char *fmt, ...) {
    if (ferror(L->f))
        return kv_err_set(L->err, KV_ERR_IO, "%s: read error: %s", L->path, strerror(errno ? errno : EIO));
    L->cut = 1;
    if (L->err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(L->err->msg, sizeof L->err->msg, fmt, ap);
        va_end(ap);
        L->err->code = KV_ERR_FORMAT;
    }
    return KV_ERR_FORMAT;
}

/* Whether `bytes` more can be in the stream (always when its size is
 * unknown; fread then finds out). */
static int fits(const loader *L, uint64_t bytes) {
    if (L->size < 0) return 1;
    long pos = ftell(L->f);
    return pos >= 0 && pos <= L->size && bytes <= (uint64_t)(L->size - pos);
}

static int read_u32(loader *L, uint32_t *x) { return fread(x, sizeof *x, 1, L->f) == 1; }

/* Reads n records of size el (bounded by MAX_COUNT and the stream) onto
 * the end of *arr. 0, or an error set naming the frame. */
static int read_records(loader *L, int frame, const char *what, void **arr, size_t *len, size_t *cap, uint32_t n,
                        size_t el) {
    if (!n) return 0;
    if (n > MAX_COUNT)
        return kv_err_set(L->err, KV_ERR_FORMAT, "%s: frame %d: %u %s", L->path, frame, n, what);
    if (!fits(L, (uint64_t)n * el))
        return cut_off(L, "%s: frame %d: truncated (%u %s)", L->path, frame, n, what);
    if (kv_grow_size(arr, cap, *len + n, el))
        return kv_err_set(L->err, KV_ERR_NOMEM, "trace: out of memory at frame %d", frame);
    if (fread((char *)*arr + *len * el, el, n, L->f) != n)
        return cut_off(L, "%s: frame %d: truncated (%u %s)", L->path, frame, n, what);
    *len += n;
    return 0;
}

/* Reads array a of frame fi into L->buf at *used, checking every count and
 * index. 0, or an error set naming the frame and the array. */
static int read_array(loader *L, int fi, int a, trace_arr *x, size_t *used) {
    static const char *names[N_ARR] = {"snapshot", "requests", "tables", "running", "waiting", "swapped", "blocks"};
    const size_t el = arr_elem[a];
    uint32_t count, mode, n;
    if (!read_u32(L, &count) || !read_u32(L, &mode))
        return cut_off(L, "%s: frame %d: truncated (%s)", L->path, fi, names[a]);
    if (count > MAX_COUNT)
        return kv_err_set(L->err, KV_ERR_FORMAT, "%s: frame %d: array %s has %u entries", L->path, fi, names[a],
                          count);
    if (a == A_HEAD && count != HEAD_WORDS)
        return kv_err_set(L->err, KV_ERR_FORMAT, "%s: frame %d: snapshot of %u words, want %u", L->path, fi, count,
                          (unsigned)HEAD_WORDS);
    if (mode == 0) {
        n = count;
    } else if (mode == 1) {
        if (fi == 0)
            return kv_err_set(L->err, KV_ERR_FORMAT, "%s: frame 0: not a keyframe (%s is a delta)", L->path,
                              names[a]);
        if (!read_u32(L, &n))
            return cut_off(L, "%s: frame %d: truncated (%s)", L->path, fi, names[a]);
        if (n > MAX_COUNT)
            return kv_err_set(L->err, KV_ERR_FORMAT, "%s: frame %d: array %s has %u entries", L->path, fi,
                              names[a], n);
        /* Grown elements are always written, so no array outgrows the
         * file that holds it. */
        if (count > L->count[a] && count - L->count[a] > n)
            return kv_err_set(L->err, KV_ERR_FORMAT, "%s: frame %d: array %s grows to %u entries with %u written",
                              L->path, fi, names[a], count, n);
    } else {
        return kv_err_set(L->err, KV_ERR_FORMAT, "%s: frame %d: array %s: bad mode %u", L->path, fi, names[a],
                          mode);
    }
    uint64_t bytes = (uint64_t)n * (mode ? 4 + el : el);
    if (!fits(L, bytes))
        return cut_off(L, "%s: frame %d: truncated (array %s has %u entries)", L->path, fi, names[a], n);
    if (kv_grow_size((void **)&L->buf, &L->cap_buf, *used + (size_t)bytes, 1))
        return kv_err_set(L->err, KV_ERR_NOMEM, "trace: out of memory at frame %d", fi);
    unsigned char *p = L->buf + *used;
    if (bytes && fread(p, 1, (size_t)bytes, L->f) != bytes)
        return cut_off(L, "%s: frame %d: truncated (array %s)", L->path, fi, names[a]);
    for (uint32_t k = 0; mode && k < n; k++) {
        uint32_t idx;
        memcpy(&idx, p + (size_t)k * (4 + el), 4);
        if (idx >= count)
            return kv_err_set(L->err, KV_ERR_FORMAT, "%s: frame %d: array %s: index %u out of range (%u entries)",
                              L->path, fi, names[a], idx, count);
    }
    x->count = count;
    x->n_items = n;
    x->full = mode == 0;
    x->off = *used;
    *used += (size_t)bytes;
    L->count[a] = count;
    return 0;
}

/* Reads the frame after its marker into t->frames[t->n]. 0 or an error. */
static int read_frame(loader *L, kv_trace *t) {
    int fi = t->n;
    trace_frame *fr = &t->frames[fi];
    memset(fr, 0, sizeof *fr);
    uint32_t flags, n_st, n_dc;
    if (!read_u32(L, &flags) || !read_u32(L, &n_st) || !read_u32(L, &n_dc))
        return cut_off(L, "%s: frame %d: truncated", L->path, fi);
    if (flags & ~FLAG_RESET)
        return kv_err_set(L->err, KV_ERR_FORMAT, "%s: frame %d: unknown flags 0x%x", L->path, fi, flags);
    size_t st0 = t->n_steps, dc0 = t->n_dec;
    if (read_records(L, fi, "step records", (void **)&t->steps, &t->n_steps, &t->cap_steps, n_st,
                     sizeof *t->steps) ||
        read_records(L, fi, "decisions", (void **)&t->decisions, &t->n_dec, &t->cap_dec, n_dc, sizeof *t->decisions))
        return -1;
    for (size_t d = dc0; d < t->n_dec; d++) t->decisions[d].text[sizeof t->decisions[d].text - 1] = 0;
    int reset = fi == 0 || (flags & FLAG_RESET);
    fr->steps_base = reset ? st0 : fr[-1].steps_base;
    fr->dec_base = reset ? dc0 : fr[-1].dec_base;
    fr->steps_end = t->n_steps;
    fr->dec_end = t->n_dec;
    size_t used = 0;
    int key = 1;
    for (int a = 0; a < N_ARR; a++) {
        if (read_array(L, fi, a, &fr->a[a], &used)) return -1;
        key &= fr->a[a].full;
        t->max_n[a] = KV_MAX(t->max_n[a], fr->a[a].count);
    }
    /* NOTE: the distance to the keyframe is not checked: at worst a frame
     * is rebuilt from the whole file. */
    fr->key = key ? fi : fr[-1].key;
    fr->blob = malloc(used ? used : 1);
    if (!fr->blob) return kv_err_set(L->err, KV_ERR_NOMEM, "trace: out of memory at frame %d", fi);
    if (used) memcpy(fr->blob, L->buf, used);
    return 0;
}

kv_trace *kv_trace_load_stream(FILE *f, const char *path, kv_err *err) {
    if (!f) {
        kv_err_set(err, KV_ERR_INVAL, "trace: no stream");
        return NULL;
    }
    if (!path) path = "trace";
    /* The size bounds every array before it is allocated: a corrupt count
     * must not ask for gigabytes. */
    loader L = {.f = f, .path = path, .size = -1, .err = err};
    long start = ftell(f);
    if (start >= 0 && fseek(f, 0, SEEK_END) == 0) {
        L.size = ftell(f);
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
    if (fread(&ver, sizeof ver, 1, f) != 1) {
        kv_err_set(err, KV_ERR_FORMAT, "%s: truncated header", path);
        goto fail;
    }
    if (ver == 1) {
        kv_err_set(err, KV_ERR_FORMAT,
                   "%s: a version 1 trace (one frame per screen refresh, from an older kvtop); this kvtop reads "
                   "version 2 only: record it again",
                   path);
        goto fail;
    }
    if (ver != TRACE_VERSION) {
        kv_err_set(err, KV_ERR_FORMAT, "%s: unsupported trace version %u (this kvtop reads version %u)", path, ver,
                   TRACE_VERSION);
        goto fail;
    }
    if (fread(sizes, sizeof sizes, 1, f) != 1 || memcmp(sizes, want, sizeof want)) {
        kv_err_set(err, KV_ERR_FORMAT, "%s: recorded by a different kvtop build (struct sizes differ)", path);
        goto fail;
    }
    if (fread(&plen, sizeof plen, 1, f) != 1 || plen > MAX_COUNT || !fits(&L, plen)) {
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
        if (got != sizeof fm) {
            if (cut_off(&L, "%s: frame %d: truncated (frame marker)", path, t->n) != KV_ERR_FORMAT) goto fail;
            break;
        }
        if (fm != FRAME_MAGIC) {
            kv_err_set(err, KV_ERR_FORMAT, "%s: frame %d: bad frame marker", path, t->n);
            goto fail;
        }
        if (t->n == INT32_MAX || kv_grow((void **)&t->frames, &t->cap, t->n + 1, sizeof *t->frames)) {
            kv_err_set(err, KV_ERR_NOMEM, "trace: out of memory at frame %d", t->n);
            goto fail;
        }
        size_t st0 = t->n_steps, dc0 = t->n_dec;
        if (read_frame(&L, t)) {
            free(t->frames[t->n].blob);
            if (!L.cut) goto fail;
            /* a recording cut off mid-frame: the frames before it stand,
             * and nothing of the partial one (its records) is kept */
            t->n_steps = st0;
            t->n_dec = dc0;
            break;
        }
        t->n++;
    }
    if (L.cut) {
        t->truncated = 1;
        if (t->n > 0)
            snprintf(t->end_note, sizeof t->end_note,
                     "%s: trace ends mid-frame after frame %d (%d complete frame%s): the recording was cut off", path,
                     t->n - 1, t->n, t->n == 1 ? "" : "s");
        else
            snprintf(t->end_note, sizeof t->end_note,
                     "%s: trace ends inside its first frame: the recording was cut off", path);
        kv_err_clear(err); /* loaded: what was read last is no error */
    }
    /* Scratch for materialising: the largest frame's arrays. */
    for (int a = 0; a < N_ARR; a++) {
        t->cur[a] = malloc((size_t)KV_MAX(t->max_n[a], 1u) * arr_elem[a]);
        if (!t->cur[a]) {
            kv_err_set(err, KV_ERR_NOMEM, "trace: out of memory");
            goto fail;
        }
    }
    t->view_req = malloc((size_t)KV_MAX(t->max_n[A_REQ], 1u) * sizeof *t->view_req);
    if (!t->view_req) {
        kv_err_set(err, KV_ERR_NOMEM, "trace: out of memory");
        goto fail;
    }
    t->at = t->shown = -1;
    free(L.buf);
    return t;
fail:
    free(L.buf);
    kv_trace_free(t);
    return NULL;
}

int kv_trace_n_frames(const kv_trace *t) { return t ? t->n : 0; }
int kv_trace_truncated(const kv_trace *t) { return t ? t->truncated : 0; }
const char *kv_trace_end_note(const kv_trace *t) { return t ? t->end_note : ""; }
const char *kv_trace_profile(const kv_trace *t) { return t && t->profile ? t->profile : ""; }

/* Applies frame fr's arrays to t->cur (indices were checked at load). */
static void apply_frame(kv_trace *t, const trace_frame *fr) {
    for (int a = 0; a < N_ARR; a++) {
        const trace_arr *x = &fr->a[a];
        const size_t el = arr_elem[a];
        const unsigned char *p = fr->blob + x->off;
        unsigned char *dst = t->cur[a];
        if (x->full) {
            if (x->count) memcpy(dst, p, (size_t)x->count * el);
        } else {
            if (x->count > t->cur_n[a]) memset(dst + (size_t)t->cur_n[a] * el, 0, (size_t)(x->count - t->cur_n[a]) * el);
            for (uint32_t k = 0; k < x->n_items; k++, p += 4 + el) {
                uint32_t idx;
                memcpy(&idx, p, 4);
                memcpy(dst + (size_t)idx * el, p + 4, el);
            }
        }
        t->cur_n[a] = x->count;
    }
}

/* The last min(want, history) records of [base, end) of an array. */
static size_t window(int want, size_t base, size_t end) {
    size_t n = want > 0 ? (size_t)want : 0;
    return KV_MIN(n, end - base);
}

/* Frame i into t->view (without touching t->shown). */
static const kv_snapshot *materialise(kv_trace *t, int i) {
    const trace_frame *fr = &t->frames[i];
    int from = t->at >= fr->key && t->at <= i ? t->at + 1 : fr->key;
    for (int j = from; j <= i; j++) apply_frame(t, &t->frames[j]);
    t->at = i;

    kv_snapshot *v = &t->view;
    memcpy(v, t->cur[A_HEAD], sizeof *v);
    uint32_t *n = t->cur_n;
    /* The requests are copied, so clamping a bad block table here leaves
     * the rebuilt arrays exactly as the file says for the next frame. */
    if (n[A_REQ]) memcpy(t->view_req, t->cur[A_REQ], (size_t)n[A_REQ] * sizeof *t->view_req);
    v->requests = n[A_REQ] ? t->view_req : NULL;
    v->tables = n[A_TAB] ? (int32_t *)t->cur[A_TAB] : NULL;
    v->running = n[A_RUN] ? (int64_t *)t->cur[A_RUN] : NULL;
    v->waiting = n[A_WAIT] ? (int64_t *)t->cur[A_WAIT] : NULL;
    v->swapped = n[A_SWAP] ? (int64_t *)t->cur[A_SWAP] : NULL;
    v->blocks = n[A_BLOCK] ? (kv_snap_block *)t->cur[A_BLOCK] : NULL;
    v->n_requests = (int)n[A_REQ];
    v->n_table_entries = (int)n[A_TAB];
    v->n_running = (int)n[A_RUN];
    v->n_waiting = (int)n[A_WAIT];
    v->n_swapped = (int)n[A_SWAP];
    if (n[A_BLOCK] || v->n_blocks < 0) v->n_blocks = (int)n[A_BLOCK]; /* no map: the pool size stays */
    size_t ns = window(v->n_steps, fr->steps_base, fr->steps_end);
    size_t nd = window(v->n_decisions, fr->dec_base, fr->dec_end);
    v->steps = ns ? t->steps + fr->steps_end - ns : NULL;
    v->decisions = nd ? t->decisions + fr->dec_end - nd : NULL;
    v->n_steps = (int)ns;
    v->n_decisions = (int)nd;
    v->cap_requests = v->n_requests, v->cap_tables = v->n_table_entries;
    v->cap_queue = KV_MAX(KV_MAX(v->n_running, v->n_waiting), v->n_swapped);
    v->cap_blocks = (int)n[A_BLOCK], v->cap_steps = v->n_steps, v->cap_decisions = v->n_decisions;
    /* A request's block table must lie inside the tables array. */
    for (int r = 0; r < v->n_requests; r++) {
        kv_snap_request *q = &t->view_req[r];
        if (q->n_blocks < 0 || q->table_offset < 0 || q->table_offset > v->n_table_entries ||
            q->n_blocks > v->n_table_entries - q->table_offset) {
            q->n_blocks = 0;
            q->table_offset = 0;
        }
        q->wait_reason[sizeof q->wait_reason - 1] = 0;
    }
    v->model_name[sizeof v->model_name - 1] = 0;
    v->backend[sizeof v->backend - 1] = 0;
    v->sim_device[sizeof v->sim_device - 1] = 0;
    return v;
}

const kv_snapshot *kv_trace_frame(kv_trace *t, int i) {
    if (!t || i < 0 || i >= t->n) return NULL;
    t->shown = i;
    return materialise(t, i);
}

int kv_trace_shown(const kv_trace *t) { return t ? t->shown : -1; }

void kv_trace_frame_news(const kv_trace *t, int i, const kv_step_record **steps, size_t *n_steps,
                         const kv_decision **decisions, size_t *n_decisions) {
    *steps = NULL, *decisions = NULL, *n_steps = 0, *n_decisions = 0;
    if (!t || i < 0 || i >= t->n) return;
    const trace_frame *fr = &t->frames[i];
    size_t st0 = i ? fr[-1].steps_end : 0, dc0 = i ? fr[-1].dec_end : 0;
    *steps = t->steps + st0, *n_steps = fr->steps_end - st0;
    *decisions = t->decisions + dc0, *n_decisions = fr->dec_end - dc0;
}
