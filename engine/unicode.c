/* unicode.c - code point classes, lowercase and decomposition for the
 * tokenizers. The class lookup is a binary search over the generated run
 * table, with a direct table for Latin-1 (most of any text); the mappings
 * are binary searches over sorted pairs. */
#include "unicode.h"

#include "unicode_tables.h"

static unsigned lookup_runs(uint32_t cp) {
    /* Last run whose first code point is <= cp. */
    size_t lo = 0, hi = KV_UNICODE_N_RUNS;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if ((kv_unicode_runs[mid] >> 9) <= cp) lo = mid;
        else hi = mid;
    }
    return kv_unicode_runs[lo] & 0x1FFu;
}

unsigned kv_unicode_flags(uint32_t cp) {
    if (cp < 256) return kv_unicode_latin1[cp];
    if (cp == KV_UTF8_INVALID) return KV_UCAT_SYMBOL;
    if (cp > 0x10FFFF) return KV_UCAT_UNDEFINED;
    return lookup_runs(cp);
}

/* The mapped value of cp in a sorted pair table, or cp. */
static uint32_t lookup_pairs(const uint32_t (*tab)[2], size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (tab[mid][0] < cp) lo = mid + 1;
        else hi = mid;
    }
    return (lo < n && tab[lo][0] == cp) ? tab[lo][1] : cp;
}

uint32_t kv_unicode_tolower(uint32_t cp) {
    if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
    return lookup_pairs(kv_unicode_lower, KV_UNICODE_LOWER_N, cp);
}

uint32_t kv_unicode_nfd_first(uint32_t cp) {
    if (cp < 0xC0) return cp;
    if (cp >= 0xAC00 && cp <= 0xD7A3) return 0x1100 + (cp - 0xAC00) / 588; /* Hangul: leading consonant */
    return lookup_pairs(kv_unicode_nfd, KV_UNICODE_NFD_N, cp);
}

const char *kv_unicode_version(void) { return KV_UNICODE_VERSION; }
