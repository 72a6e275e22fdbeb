/* fuzz_kv_events.c - libFuzzer target for vLLM's KV-event batches
 * (engine/msgpack.c, engine/kv_events.c) and the prefix tree they feed
 * (engine/kv_ptree*.c): the input is split into batches at 0xFF 0xFE 0xFD
 * and applied in order. Oracles: no crash, leak, hang or sanitizer report;
 * a refused batch changes no block and no counter but `rejected`; the
 * summary's figures agree with each other (roots and leaves within the
 * resident blocks, chain blocks at least the resident ones, the cells laid
 * out no more than the blocks). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/kv_events.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static kv_ptree t;
    static int ready;
    if (!ready) {
        if (kv_ptree_init(&t, 64, NULL)) abort();
        ready = 1;
    }
    kv_ptree_clear(&t);
    memset(&t.c, 0, sizeof t.c);
    t.c.last_seq = -1;
    t.ev_n = t.ev_head = 0;
    size_t start = 0;
    int64_t seq = 0;
    for (size_t i = 0; i <= size; i++) {
        int cut = i == size || (i + 2 < size && data[i] == 0xff && data[i + 1] == 0xfe && data[i + 2] == 0xfd);
        if (!cut) continue;
        uint32_t n_before = t.n;
        kv_ptree_counts c0 = t.c;
        kv_ptree_seq(&t, seq++);
        kv_ptree_counts c1 = t.c;
        if (kv_ptree_apply(&t, data + start, i - start, NULL)) {
            c1.rejected++;
            if (t.n != n_before || memcmp(&c1, &t.c, sizeof c1)) abort();
        }
        (void)c0;
        start = i + 3;
        i += 2;
    }
    kv_ptree_view v;
    kv_ptree_summarize(&t, &v);
    if (v.resident != (int)t.n || v.roots > v.resident || v.leaves > v.resident) abort();
    if (v.resident && (v.roots < 1 || v.leaves < 1 || v.chain_blocks < (uint64_t)v.resident)) abort();
    if (v.n_cells > v.resident || v.hit_potential < 0 || v.hit_potential >= 1) abort();
    int fam = v.other_blocks;
    for (int k = 0; k < v.n_fam; k++) fam += v.fam[k].blocks;
    if (fam != v.resident) abort();
    return 0;
}
