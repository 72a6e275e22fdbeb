/* utf8.h - the one UTF-8 codec of the project: strict decoding (invalid
 * bytes are reported, never skipped), encoding, and the small questions
 * about sequence boundaries that streaming text asks. Strict means every
 * code point has exactly one accepted spelling: overlong forms, surrogates
 * (U+D800..U+DFFF) and values above U+10FFFF are invalid both ways. No
 * allocation, nothing of the project below it. */
#ifndef KV_UTF8_H
#define KV_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Returned by kv_utf8_decode for a byte that does not start a valid
 * sequence (bad lead byte, truncated or overlong sequence, surrogate, or a
 * value above U+10FFFF). */
#define KV_UTF8_INVALID 0xFFFFFFFFu

/* Decodes one code point from s[0..len) (len >= 1). Returns the number of
 * bytes consumed (1..4) and writes the code point to *cp; for an invalid
 * sequence it consumes exactly one byte and writes KV_UTF8_INVALID. */
size_t kv_utf8_decode(const unsigned char *s, size_t len, uint32_t *cp /* OUT: code point */);

/* Length of the valid sequence at s[0..len) (len >= 1), or 0 when the
 * bytes there are not valid UTF-8. */
size_t kv_utf8_valid_len(const unsigned char *s, size_t len);

/* Writes the UTF-8 form of cp to out and returns its length (1..4);
 * returns 0 and writes nothing for a value that has none: a surrogate or a
 * value above U+10FFFF. */
size_t kv_utf8_encode(uint32_t cp, char out[4] /* OUT: the bytes, not terminated */);

/* Length of the sequence a lead byte announces (1..4), or 0 for a
 * continuation byte or a byte that never starts a sequence (0xC0, 0xC1,
 * 0xF5..0xFF). */
int kv_utf8_seq_len(unsigned char lead);

/* 1 when s[0..len) is entirely valid UTF-8. */
int kv_utf8_valid(const char *s, size_t len);

/* The largest cut <= n of s[0..len) (n <= len) that does not fall between
 * a lead byte and its continuation bytes: n itself when s[n] is not a
 * continuation byte (or n == len); 0 when only a cut inside a character
 * would do. */
size_t kv_utf8_boundary(const char *s, size_t len, size_t n);

#endif
