/* cleanup.c - unlink registered temporary files on SIGINT/SIGTERM/SIGHUP.
 * The table is fixed-size and each slot is published with an atomic flag,
 * so the handler reads it without locks while the main thread registers. */
#include "cleanup.h"

#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

typedef struct slot {
    atomic_int used;    /* 1 while path holds a registered file */
    char path[4096];    /* NUL-terminated */
} slot;

static slot slots[KV_CLEANUP_MAX];

int kv_cleanup_add(const char *path) {
    size_t n = path ? strlen(path) : 0;
    if (!n || n >= sizeof slots[0].path) return KV_ERR_RANGE;
    for (int i = 0; i < KV_CLEANUP_MAX; i++) {
        if (atomic_load(&slots[i].used)) continue;
        memcpy(slots[i].path, path, n + 1);
        atomic_store(&slots[i].used, 1);
        return 0;
    }
    return KV_ERR_RANGE;
}

void kv_cleanup_remove(const char *path) {
    if (!path) return;
    for (int i = 0; i < KV_CLEANUP_MAX; i++)
        if (atomic_load(&slots[i].used) && !strcmp(slots[i].path, path)) atomic_store(&slots[i].used, 0);
}

void kv_cleanup_run(void) {
    /* files first, then the directories they were in (rmdir only empties
     * what is already empty), whatever order they were registered in */
    for (int i = 0; i < KV_CLEANUP_MAX; i++)
        if (atomic_load(&slots[i].used) && unlink(slots[i].path) == 0) atomic_store(&slots[i].used, 0);
    for (int i = 0; i < KV_CLEANUP_MAX; i++)
        if (atomic_exchange(&slots[i].used, 0)) rmdir(slots[i].path);
}

static void on_signal(int sig) {
    kv_cleanup_run();
    signal(sig, SIG_DFL);
    raise(sig);
}

int kv_cleanup_install(void) {
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < KV_ARRAY_LEN(sigs); i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        if (sigaction(sigs[i], &sa, NULL) != 0) return KV_ERR_INVAL;
    }
    return 0;
}
