/* fuzz_profile.c - libFuzzer target for the YAML profile loader and --set.
 * Oracles: no crash or leak; a failed load leaves the config untouched; a
 * loaded config validates, and dump -> load gives the same config again.
 * The input is also split into lines, each applied as a --set. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../profiles/profile.h"

static void dump_to(const kv_config *c, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    FILE *f = open_memstream(text, len);
    if (!f) abort();
    kv_profile_dump(c, f);
    fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kv_config cfg, before;
    kv_err err;
    memset(&cfg, 0x5C, sizeof cfg);
    before = cfg;
    int rc = kv_profile_load_mem((const char *)data, size, "fuzz.yaml", &cfg, &err);
    if (rc) {
        if (memcmp(&cfg, &before, sizeof cfg)) abort(); /* changed on error */
        if (!err.msg[0]) abort();                        /* an error says what */
    } else {
        if (kv_config_validate(&cfg, &err)) abort();
        char *t1, *t2;
        size_t l1, l2;
        dump_to(&cfg, &t1, &l1);
        kv_config again;
        if (kv_profile_load_mem(t1, l1, "dump.yaml", &again, &err)) {
            fprintf(stderr, "dump does not load: %s\n%s\n", err.msg, t1);
            abort();
        }
        dump_to(&again, &t2, &l2);
        if (l1 != l2 || memcmp(t1, t2, l1)) abort();
        free(t1);
        free(t2);
    }

    /* Each line as a --set on the defaults. */
    kv_config c;
    kv_config_default(&c);
    char line[512];
    size_t pos = 0;
    while (pos < size) {
        size_t n = 0;
        while (pos < size && data[pos] != '\n') {
            if (n + 1 < sizeof line) line[n++] = (char)data[pos];
            pos++;
        }
        pos++;
        line[n] = '\0';
        kv_config prev = c;
        if (kv_profile_set(&c, line, &err) != 0 && memcmp(&c, &prev, sizeof c)) abort();
    }
    kv_config_validate(&c, &err);
    return 0;
}
