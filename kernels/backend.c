/* backend.c - the registry of compiled-in backends: name -> constructor.
 * Adding a backend is one line in the table below (plus its constructor's
 * declaration). */
#include "backend.h"

#include <pthread.h>
#include <string.h>

#include "cpu.h"
#include "sim.h"

#ifdef KV_HAVE_CUDA
kv_backend *kv_cuda_backend_create(int n_threads, kv_err *err);
#endif

typedef struct backend_entry {
    const char *name;
    kv_backend *(*create)(int n_threads, kv_err *err);
} backend_entry;

static const backend_entry registry[] = {
    {"cpu", kv_cpu_backend_create},
    {"sim", kv_sim_backend_create},
#ifdef KV_HAVE_CUDA
    {"cuda", kv_cuda_backend_create},
#endif
};

#define N_BACKENDS (sizeof registry / sizeof registry[0])

kv_backend *kv_backend_create(const char *name, int n_threads, kv_err *err) {
    if (!name) {
        kv_err_set(err, KV_ERR_INVAL, "backend: no name given");
        return NULL;
    }
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (!strcmp(registry[i].name, name)) return registry[i].create(n_threads, err);
    if (!strcmp(name, "cuda"))
        kv_err_set(err, KV_ERR_UNSUPPORTED, "backend 'cuda' is not compiled in (build with make CUDA=1)");
    else
        kv_err_set(err, KV_ERR_INVAL, "unknown backend '%s'", name);
    return NULL;
}

kv_backend *kv_backend_create_on(const char *name, const char *device, int n_threads, kv_err *err) {
    if (name && !strcmp(name, "sim") && device && *device) return kv_sim_backend_create_device(device, n_threads, err);
    return kv_backend_create(name, n_threads, err);
}

void kv_backend_free(kv_backend *b) {
    if (b && b->ops && b->ops->destroy) b->ops->destroy(b);
}

static const char *names[N_BACKENDS + 1]; /* NULL-terminated copy of the registry's names */
static pthread_once_t names_once = PTHREAD_ONCE_INIT;

static void names_init(void) {
    for (size_t i = 0; i < N_BACKENDS; i++) names[i] = registry[i].name;
    names[N_BACKENDS] = NULL;
}

const char *const *kv_backend_names(void) {
    pthread_once(&names_once, names_init);
    return names;
}

int kv_backend_status(kv_backend *b, kv_err *err) {
    if (!b || !b->ops || !b->ops->status) return 0;
    return b->ops->status(b, err);
}

int kv_backend_reserve(kv_backend *b, const kv_backend_limits *lim, kv_err *err) {
    if (!b || !lim) return kv_err_set(err, KV_ERR_INVAL, "backend: reserve without a backend or limits");
    if (lim->max_rows < 1 || lim->max_k < 1)
        return kv_err_set(err, KV_ERR_INVAL, "backend %s: reserve for %d rows of %lld", b->ops->name, lim->max_rows,
                          (long long)lim->max_k);
    return b->ops->reserve ? b->ops->reserve(b, lim, err) : 0;
}

int kv_backend_clock_get(kv_backend *b, kv_backend_clock *out) {
    memset(out, 0, sizeof *out);
    if (!b || !b->ops || !b->ops->clock) return 0;
    b->ops->clock(b, out);
    return 1;
}

int kv_backend_charge(kv_backend *b, const struct kv_sim_cost *c, int n, int launch) {
    if (!b || !b->ops || !b->ops->charge || (!c && n > 0)) return KV_ERR_UNSUPPORTED;
    if (n > 0) b->ops->charge(b, c, n, launch);
    return 0;
}

void kv_backend_set_kv_share(kv_backend *b, double share) {
    if (b && b->ops && b->ops->set_kv_share) b->ops->set_kv_share(b, share);
}

kv_backend *kv_backend_create_model(const struct kv_sim_device *d, int n_threads, kv_err *err) {
    return kv_sim_backend_create_custom(d, n_threads, err);
}

void kv_backend_matmul_same_x(kv_backend *b, const kv_tensor *const *w, int nw, const float *x, float *const *y, int n) {
    if (b->ops->matmul_multi)
        b->ops->matmul_multi(b, w, nw, x, y, n);
    else
        for (int i = 0; i < nw; i++) b->ops->matmul(b, w[i], x, y[i], n);
}

void kv_backend_matmul_groups(kv_backend *b, const kv_matmul_group *g, int ng) {
    if (b->ops->matmul_groups)
        b->ops->matmul_groups(b, g, ng);
    else
        for (int i = 0; i < ng; i++) kv_backend_matmul_same_x(b, g[i].w, g[i].nw, g[i].x, g[i].y, g[i].n);
}
