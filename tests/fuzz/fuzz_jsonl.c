/* fuzz_jsonl.c - libFuzzer target for the strict JSON reader, the JSON
 * writer and the JSONL prompts reader. Oracles: no crash or leak; whatever
 * parses, written back and parsed again, writes the same bytes (the writer
 * emits only what the reader accepts); a failed prompts parse leaves its
 * outputs alone. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/json.h"
#include "../../engine/workload.h"

static char *write_value(const kv_json *v, int pretty, size_t *len) {
    char *text = NULL;
    FILE *f = open_memstream(&text, len);
    if (!f) abort();
    kv_json_writer w;
    kv_json_writer_init(&w, f, pretty);
    kv_json_write_value(&w, v);
    if (kv_json_writer_finish(&w)) abort();
    fclose(f);
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kv_err err;
    kv_json *v = kv_json_parse((const char *)data, size, &err);
    if (v) {
        for (int pretty = 0; pretty <= 1; pretty++) {
            size_t l1, l2;
            char *t1 = write_value(v, pretty, &l1);
            kv_json *v2 = kv_json_parse(t1, l1, &err);
            if (!v2) {
                fprintf(stderr, "written JSON does not parse: %s\n%s\n", err.msg, t1);
                abort();
            }
            char *t2 = write_value(v2, pretty, &l2);
            if (l1 != l2 || memcmp(t1, t2, l1)) abort();
            kv_json_free(v2);
            free(t1);
            free(t2);
        }
        kv_json_free(v);
    } else if (!strstr(err.msg, "line ")) {
        abort(); /* errors carry a position */
    }

    char **prompts = (char **)&err;
    int n = -7;
    if (kv_workload_parse_prompts((const char *)data, size, "fuzz.jsonl", &prompts, &n, &err) == 0) {
        for (int i = 0; i < n; i++)
            if (!prompts[i][0]) abort(); /* empty prompts are refused */
        kv_workload_free_prompts(prompts, n);
    } else if (prompts != (char **)&err || n != -7) {
        abort();
    }
    return 0;
}
