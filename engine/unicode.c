/* unicode.c - code point classes for the tokenizers. The class lookup is
 * a binary search over the generated run table, with a direct table for
 * Latin-1 (most of any text). */
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

const char *kv_unicode_version(void) { return KV_UNICODE_VERSION; }
