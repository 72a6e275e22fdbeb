/* utf8.c - the strict UTF-8 codec behind utf8.h. */
#include "utf8.h"

size_t kv_utf8_decode(const unsigned char *s, size_t len, uint32_t *cp) {
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int n = kv_utf8_seq_len(c);
    if (n < 2 || (size_t)n > len) {
        *cp = KV_UTF8_INVALID;
        return 1;
    }
    uint32_t v = c & (0x7Fu >> n);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = KV_UTF8_INVALID;
            return 1;
        }
        v = (v << 6) | (s[i] & 0x3Fu);
    }
    /* Reject overlong forms, surrogates and values past U+10FFFF so every
     * code point has exactly one accepted spelling. */
    static const uint32_t min_for_len[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min_for_len[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *cp = KV_UTF8_INVALID;
        return 1;
    }
    *cp = v;
    return (size_t)n;
}

size_t kv_utf8_valid_len(const unsigned char *s, size_t len) {
    uint32_t cp;
    size_t n = kv_utf8_decode(s, len, &cp);
    return cp == KV_UTF8_INVALID ? 0 : n;
}

size_t kv_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp <= 0x10FFFF) {
        out[0] = (char)(0xF0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}

int kv_utf8_seq_len(unsigned char lead) {
    if (lead < 0x80) return 1;
    if (lead < 0xC2) return 0; /* continuation byte, or overlong-only 0xC0/0xC1 */
    if (lead < 0xE0) return 2;
    if (lead < 0xF0) return 3;
    if (lead < 0xF5) return 4;
    return 0;
}

int kv_utf8_valid(const char *s, size_t len) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        uint32_t cp;
        i += kv_utf8_decode(p + i, len - i, &cp);
        if (cp == KV_UTF8_INVALID) return 0;
    }
    return 1;
}

size_t kv_utf8_boundary(const char *s, size_t len, size_t n) {
    if (n >= len) return len;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    return n;
}
