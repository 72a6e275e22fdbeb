/* fuzz_gguf.c - libFuzzer target for the GGUF reader: any input must either
 * be rejected with a message or open into a handle whose every key, value,
 * string-array element and tensor (first and last data byte) can be read
 * without touching memory outside the input. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../../engine/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kv_err err = {0};
    kv_gguf *g = kv_gguf_open_mem(data, size, &err);
    if (!g) {
        /* a rejection always says why */
        if (err.code == 0 || err.msg[0] == '\0') __builtin_trap();
        return 0;
    }
    volatile unsigned sink = 0;
    char buf[512], key[256];
    for (int64_t i = 0; i < kv_gguf_n_kv(g); i++) {
        kv_gguf_str k = kv_gguf_key_at(g, i);
        if (!k.data || k.len == 0) __builtin_trap();
        kv_gguf_format_value(g, i, buf, sizeof buf);
        if (strlen(buf) >= sizeof buf) __builtin_trap();
        if (k.len >= sizeof key) continue;
        memcpy(key, k.data, (size_t)k.len);
        key[k.len] = '\0';
        if (kv_gguf_find_key(g, key) != i) __builtin_trap();
        uint64_t u;
        int64_t s;
        uint32_t u32;
        float f;
        int b;
        kv_gguf_str str;
        kv_gguf_get_u64(g, key, &u, NULL);
        kv_gguf_get_i64(g, key, &s, NULL);
        kv_gguf_get_u32(g, key, &u32, NULL);
        kv_gguf_get_f32(g, key, &f, NULL);
        kv_gguf_get_bool(g, key, &b, NULL);
        if (kv_gguf_get_str(g, key, &str, NULL) == 0 && str.len) sink += (unsigned char)str.data[str.len - 1];
        kv_gguf_vtype et;
        uint64_t n;
        if (kv_gguf_get_arr(g, key, &et, &n, NULL) == 0 && n) {
            if (et == KV_GGUF_STRING) {
                for (uint64_t j = 0; j < n; j++) {
                    kv_gguf_str e = kv_gguf_arr_str(g, key, j);
                    if (!e.data) __builtin_trap();
                    if (e.len) sink += (unsigned char)e.data[0] + (unsigned char)e.data[e.len - 1];
                }
            } else {
                /* a float element may be negative, huge or NaN: no conversion to unsigned */
                sink += (unsigned)kv_gguf_arr_i64(g, key, 0) + (kv_gguf_arr_f64(g, key, n - 1) > 0.0);
            }
        }
    }
    for (int64_t i = 0; i < kv_gguf_n_tensors(g); i++) {
        const kv_gguf_tensor *t = kv_gguf_tensor_at(g, i);
        if (!t || t->size == 0 || t->n_dims < 1 || t->n_dims > KV_GGUF_MAX_DIMS) __builtin_trap();
        const uint8_t *d = t->data;
        if (d < data || d + t->size > data + size) __builtin_trap();
        sink += d[0] + d[t->size - 1];
        char name[128];
        if (t->name.len < sizeof name) {
            memcpy(name, t->name.data, (size_t)t->name.len);
            name[t->name.len] = '\0';
            if (kv_gguf_find_tensor(g, name) != t) __builtin_trap();
        }
    }
    (void)sink;
    kv_gguf_close(g);
    return 0;
}
