/* eval_tasks.h - task sets for `kvtop eval --tasks DIR`: what quantization
 * costs on real tasks, which perplexity can hide. A task set is a JSONL
 * file of generation tasks, one object per line:
 *   json.jsonl  {"id", "prompt", "prefix", "required": {key: type}, "max_tokens"}
 *       the greedy answer, read as continuing `prefix` (e.g. "{"), must
 *       hold a JSON object with every required key of its type ("string",
 *       "number", "integer", "boolean", "array", "object", "null")
 *   code.jsonl  {"id", "prompt", "tests", "max_tokens"}
 *       prompt is the head of a Python function; the greedy completion up
 *       to the end of its body, then `tests` (asserts), must run to exit 0
 *       in a sandboxed python3 (kv_task_run_python)
 * Text sets (low-resource language, long-tail tokens) are plain .txt files
 * scored by eval.h's perplexity and top-1 against f32.
 * Scorers are pure functions of the answer text (unit-tested on hand-made
 * answers); only kv_task_run_python touches the system. */
#ifndef KV_EVAL_TASKS_H
#define KV_EVAL_TASKS_H

#include <stddef.h>

#include "../base/common.h"
#include "json.h"

typedef enum kv_task_kind { KV_TASK_JSON = 0, KV_TASK_CODE = 1 } kv_task_kind;

/* One task; strings are owned by the set. */
typedef struct kv_task {
    kv_task_kind kind;
    const char *id;
    const char *prompt;
    const char *prefix;        /* json: what the answer continues ("" when none) */
    const kv_json *required;   /* json: {key: type name} */
    const char *tests;         /* code: Python asserts */
    int max_tokens;            /* tokens the answer may have (1..4096; default 64) */
} kv_task;

typedef struct kv_task_set {
    kv_task *tasks;            /* (n) */
    int n;
    kv_json **docs;            /* (n) the parsed lines the tasks borrow from */
} kv_task_set;

/* Parses a JSONL task file held in memory (blank lines skipped); `name`
 * names it in messages ("json.jsonl:3: ..."). Every line must be an object
 * with a non-empty string "id" and "prompt"; json tasks a "required"
 * object whose values are type names; code tasks a string "tests";
 * "max_tokens", when present, an integer in [1, 4096]. On error returns
 * KV_ERR_FORMAT with err naming file:line (and leaves *out empty). */
int kv_task_set_parse(const char *buf, size_t len, const char *name, kv_task_kind kind, kv_task_set *out /* OUT: */,
                      kv_err *err);
void kv_task_set_free(kv_task_set *s); /* NULL is a no-op; leaves *s empty */

/* JSON scorer: prefix + answer must contain a balanced {...} (the first
 * '{' to its matching '}', strings and escapes respected) that parses as
 * an object holding every required key with its type. Returns 1 (pass) or
 * 0 with why (cap bytes) saying what failed. */
int kv_task_json_check(const char *prefix, const char *answer, const kv_json *required, char *why /* OUT: (cap) */,
                       size_t cap);

/* Code: the program that is run: prompt, then the completion up to the end
 * of the function body (the first non-blank line that starts in column 0),
 * then a newline and the tests. Returns a malloc'ed string or NULL (out of
 * memory). */
char *kv_task_code_program(const char *prompt, const char *completion, const char *tests);

/* Runs program with `python3 -I -S -B` in a fresh temp directory (its
 * cwd and HOME), an empty environment but PATH, stdin from /dev/null,
 * CPU time, address space, file size and open files limited, in a new
 * network namespace when the kernel allows one (*isolated_net = 1; else 0:
 * loopback and outside network stay reachable), killed after timeout_s.
 * Returns 1 when it exited 0 (the asserts held), 0 when it failed (why:
 * the last line of its stderr, "timed out", a signal), or KV_ERR_UNSUPPORTED
 * when python3 cannot be started / KV_ERR_IO for the temp directory. */
int kv_task_run_python(const char *program, double timeout_s, int *isolated_net /* OUT: may be NULL */,
                       char *why /* OUT: (cap) */, size_t cap);

#endif
