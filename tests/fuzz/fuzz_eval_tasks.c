/* fuzz_eval_tasks.c - libFuzzer target for the `kvtop eval --tasks` task
 * file parser and the JSON scorer. The first byte picks the task kind; the
 * rest is the JSONL file. Oracles: no crash or leak; a failed parse leaves
 * the set empty with a message; a parsed set has valid tasks (non-empty id
 * and prompt, max_tokens in range, a JSON task's required object); every
 * parsed JSON task's scorer runs over the input itself as an answer and
 * returns 0 or 1 with a NUL-terminated reason. The code program builder
 * runs too (python3 is never started here). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/eval_tasks.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    kv_task_kind kind = data[0] & 1 ? KV_TASK_CODE : KV_TASK_JSON;
    const char *buf = (const char *)data + 1;
    size_t len = size - 1;
    kv_task_set s;
    kv_err err = {0};
    int rc = kv_task_set_parse(buf, len, "fuzz.jsonl", kind, &s, &err);
    if (rc) {
        if (s.n != 0 || s.tasks || !err.msg[0]) abort();
        return 0;
    }
    char *answer = malloc(len + 1);
    if (!answer) abort();
    memcpy(answer, buf, len);
    answer[len] = 0;
    for (int i = 0; i < s.n; i++) {
        const kv_task *t = &s.tasks[i];
        if (!t->id[0] || !t->prompt[0] || t->max_tokens < 1 || t->max_tokens > 4096) abort();
        if (kind == KV_TASK_JSON) {
            if (!t->required) abort();
            char why[128];
            int ok = kv_task_json_check(t->prefix, answer, t->required, why, sizeof why);
            if ((ok != 0 && ok != 1) || !memchr(why, 0, sizeof why)) abort();
        } else {
            char *prog = kv_task_code_program(t->prompt, answer, t->tests);
            if (!prog) abort();
            free(prog);
        }
    }
    free(answer);
    kv_task_set_free(&s);
    return 0;
}
