/* kv_ptree_view.c - the prefix tree summarised for drawing (see
 * kv_events.h): depths, leaf chains, families, the grid of resident blocks
 * and the recent removals. Parents are found by hash lookup each time; a
 * cycle (which only a hostile stream makes) is cut where it is found. */
#include "kv_events.h"

#include <string.h>

/* The dense index of the resident parent of slot s, or -1. */
static int32_t parent_dense(const kv_ptree *t, uint32_t s, const int32_t *dense) {
    const kv_ptree_node *nd = &t->tab[s];
    if (!nd->has_parent) return -1;
    const kv_ptree_node *p = kv_ptree_find(t, &nd->parent);
    if (!p) return -1;
    uint32_t ps = (uint32_t)(p - t->tab);
    return ps == s ? -1 : dense[ps];
}

/* dep[j] for every node: 1 + its resident parent's; cycles cut. stack is
 * scratch of n. */
static void depths(int32_t n, int32_t *par, int32_t *dep, int32_t *stack) {
    for (int32_t j = 0; j < n; j++) dep[j] = 0;
    for (int32_t j = 0; j < n; j++) {
        while (!dep[j]) {
            int32_t sp = 0, cur = j;
            while (cur >= 0 && dep[cur] == 0) {
                stack[sp++] = cur;
                dep[cur] = -1;
                cur = par[cur];
            }
            if (cur >= 0 && dep[cur] == -1) { /* a cycle through cur: cut it, walk again */
                par[cur] = -1;
                for (int32_t k = 0; k < sp; k++) dep[stack[k]] = 0;
                continue;
            }
            int32_t base = cur < 0 ? 0 : dep[cur];
            while (sp) dep[stack[--sp]] = ++base;
        }
    }
}

/* The families (roots) by blocks: the largest KV_PTREE_FAMILIES into top. */
static int top_families(int32_t n, const int32_t *par, const int32_t *size, int32_t *top) {
    int nt = 0;
    for (int32_t j = 0; j < n; j++) {
        if (par[j] >= 0) continue;
        int pos = nt;
        while (pos > 0 && size[top[pos - 1]] < size[j]) pos--;
        if (pos >= KV_PTREE_FAMILIES) continue;
        int last = nt < KV_PTREE_FAMILIES ? nt : KV_PTREE_FAMILIES - 1;
        for (int k = last; k > pos; k--) top[k] = top[k - 1];
        top[pos] = j;
        if (nt < KV_PTREE_FAMILIES) nt++;
    }
    return nt;
}

static int rank_of(const int32_t *top, int nt, int32_t root) {
    for (int k = 0; k < nt; k++)
        if (top[k] == root) return k;
    return KV_PTREE_FAMILIES;
}

void kv_ptree_summarize(kv_ptree *t, kv_ptree_view *out) {
    memset(out, 0, sizeof *out);
    out->c = t->c;
    memcpy(out->last_error, t->last_error, sizeof out->last_error);
    for (int k = 0; k < t->ev_n; k++) /* newest first */
        out->ev[k] = t->ev[(t->ev_head - 1 - k + 2 * KV_PTREE_EVICTS) % KV_PTREE_EVICTS];
    out->ev_n = t->ev_n;
    int32_t *ids = t->scratch, *dense = ids + t->cap, *par = dense + t->cap, *dep = par + t->cap;
    int32_t *leaf = dep + t->cap, *kids = leaf + t->cap, *root = kids + t->cap, *order = root + t->cap;
    int32_t n = 0;
    for (uint32_t s = 0; s < t->cap; s++)
        if (t->tab[s].used) {
            dense[s] = n;
            ids[n++] = (int32_t)s;
        }
    out->resident = n;
    if (!n) return;
    for (int32_t j = 0; j < n; j++) {
        par[j] = parent_dense(t, (uint32_t)ids[j], dense);
        out->tokens += t->tab[ids[j]].tokens;
    }
    depths(n, par, dep, order);
    /* depth order (counting sort; dense is free again) */
    int32_t maxd = 0;
    for (int32_t j = 0; j < n; j++) maxd = dep[j] > maxd ? dep[j] : maxd;
    out->max_depth = maxd;
    int32_t *cnt = dense;
    memset(cnt, 0, (size_t)(maxd + 2) * sizeof *cnt);
    for (int32_t j = 0; j < n; j++) cnt[dep[j] + 1]++;
    for (int32_t d = 1; d <= maxd + 1; d++) cnt[d] += cnt[d - 1];
    for (int32_t j = 0; j < n; j++) order[cnt[dep[j]]++] = j;
    memset(kids, 0, (size_t)n * sizeof *kids);
    for (int32_t j = 0; j < n; j++)
        if (par[j] >= 0) kids[par[j]]++;
    for (int32_t j = 0; j < n; j++) {
        leaf[j] = kids[j] == 0;
        out->leaves += leaf[j];
        out->branch_points += kids[j] >= 2;
        if (par[j] < 0) {
            out->roots++;
            out->orphans += t->tab[ids[j]].has_parent;
        }
    }
    for (int32_t k = n - 1; k >= 0; k--) { /* deepest first: leaf chains up to the roots */
        int32_t j = order[k];
        if (par[j] >= 0) leaf[par[j]] += leaf[j];
    }
    for (int32_t j = 0; j < n; j++) {
        out->chain_blocks += (uint64_t)leaf[j];
        out->shared += leaf[j] >= 2;
    }
    out->hit_potential = out->chain_blocks ? 1.0 - (double)n / (double)out->chain_blocks : 0;
    /* families: kids becomes each root's block count */
    memset(kids, 0, (size_t)n * sizeof *kids);
    for (int32_t k = 0; k < n; k++) {
        int32_t j = order[k];
        root[j] = par[j] < 0 ? j : root[par[j]];
        kids[root[j]]++;
    }
    int32_t top[KV_PTREE_FAMILIES];
    int nt = top_families(n, par, kids, top);
    out->n_fam = nt;
    for (int k = 0; k < nt; k++) {
        out->fam[k].blocks = kids[top[k]];
        out->fam[k].leaves = leaf[top[k]];
    }
    for (int32_t j = 0; j < n; j++) {
        int r = rank_of(top, nt, root[j]);
        if (r == KV_PTREE_FAMILIES) {
            out->other_blocks++;
            continue;
        }
        if (dep[j] > out->fam[r].depth) out->fam[r].depth = dep[j];
        out->fam[r].shared += leaf[j] >= 2;
    }
    for (int r = 0; r <= nt && out->n_cells < KV_PTREE_GRID; r++) {
        int want = r < nt ? r : KV_PTREE_FAMILIES;
        for (int32_t k = 0; k < n && out->n_cells < KV_PTREE_GRID; k++) {
            int32_t j = order[k];
            if (rank_of(top, nt, root[j]) != want) continue;
            out->cell[out->n_cells++] = (uint8_t)(want | (leaf[j] >= 2 ? KV_PTREE_CELL_SHARED : 0));
        }
    }
}
