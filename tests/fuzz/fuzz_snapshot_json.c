/* fuzz_snapshot_json.c - libFuzzer target for the attach client's reader
 * of kvtop's snapshot JSON (engine/snapshot_parse.c). Oracles: no crash,
 * leak or sanitizer report; what is accepted names only blocks inside its
 * map; accepted text written back by the server's writer reads back and
 * writes the same bytes again; a rejected frame leaves the snapshot as it
 * was (the same bytes written before and after). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/snapshot_parse.h"
#include "../../server/snapshot_json.h"

static char *write_snap(const kv_snapshot *s, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) abort();
    srv_snapshot_write(f, s, "m", -1, NULL);
    fclose(f);
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kv_snapshot *s = kv_snapshot_new();
    if (!s) return 0;
    kv_err err;
    /* twice: the second parse is a delta onto the first when it says so */
    for (int round = 0; round < 2; round++) {
        size_t l0;
        char *before = write_snap(s, &l0);
        int rc = kv_snapshot_parse((const char *)data, size, s, NULL, 0, &err);
        size_t l1;
        char *after = write_snap(s, &l1);
        if (rc && (l0 != l1 || memcmp(before, after, l0))) abort();
        free(before);
        free(after);
        if (rc) break;
        for (int i = 0; i < s->n_requests; i++) {
            const kv_snap_request *q = &s->requests[i];
            if (q->next_block >= s->n_blocks) abort();
            for (int k = 0; k < q->n_blocks; k++) {
                int b = s->tables[q->table_offset + k];
                if (b < 0 || b >= s->n_blocks) abort();
            }
        }
    }
    size_t l1, l2;
    char *t1 = write_snap(s, &l1);
    kv_snapshot *r = kv_snapshot_new();
    if (r && kv_snapshot_parse(t1, l1, r, NULL, 0, &err) == 0) {
        char *t2 = write_snap(r, &l2);
        if (l1 != l2 || memcmp(t1, t2, l1)) abort();
        free(t2);
    } else if (r) {
        abort(); /* the writer's own output must read back */
    }
    free(t1);
    kv_snapshot_free(r);
    kv_snapshot_free(s);
    return 0;
}
