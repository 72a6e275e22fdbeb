/* test_eval_tasks.c - the task scorers of `kvtop eval --tasks` on
 * hand-made answers that must pass and must fail: the JSON schema check
 * (prefix continuation, nesting, strings with braces, every type), the
 * code program's cut at the end of the function body, the sandboxed
 * python3 run (asserts that hold, asserts that fail, a syntax error, an
 * endless loop killed at the timeout, no files left behind), and the task
 * file parser's errors naming file:line. The shipped sets in data/eval
 * parse. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/eval_tasks.h"
#include "../harness.h"

static kv_json *req(const char *text) { return kv_json_parse(text, strlen(text), NULL); }

static void test_json_check(void) {
    kv_json *r = req("{\"name\": \"string\", \"age\": \"integer\", \"tags\": \"array\", \"ok\": \"boolean\"}");
    REQUIRE(r);
    char why[200];
    CHECK(kv_task_json_check("{", "\"name\": \"Ana\", \"age\": 31, \"tags\": [\"a\"], \"ok\": true}\nmore", r, why,
                             sizeof why) == 1);
    CHECK(kv_task_json_check("", "Sure! {\"name\": \"x}{\", \"age\": 2, \"tags\": [], \"ok\": false} done", r, why,
                             sizeof why) == 1);
    /* must fail, each for its reason */
    CHECK(kv_task_json_check("{", "\"name\": \"Ana\", \"age\": 31.5, \"tags\": [], \"ok\": true}", r, why,
                             sizeof why) == 0 && strstr(why, "age") && strstr(why, "integer"));
    CHECK(kv_task_json_check("{", "\"name\": \"Ana\", \"age\": 3, \"tags\": [], \"ok\": \"yes\"}", r, why,
                             sizeof why) == 0 && strstr(why, "ok"));
    CHECK(kv_task_json_check("{", "\"name\": \"Ana\", \"age\": 3, \"ok\": true}", r, why, sizeof why) == 0 &&
          strstr(why, "tags"));
    CHECK(kv_task_json_check("{", "\"name\": \"Ana\", \"age\": 3,", r, why, sizeof why) == 0 &&
          strstr(why, "close"));
    CHECK(kv_task_json_check("", "no json here", r, why, sizeof why) == 0 && strstr(why, "'{'"));
    CHECK(kv_task_json_check("{", "name: 'Ana', age: 3, tags: [], ok: true}", r, why, sizeof why) == 0 &&
          strstr(why, "parse"));
    kv_json_free(r);
    r = req("{\"who\": \"object\", \"n\": \"number\", \"z\": \"null\"}");
    CHECK(kv_task_json_check("{\"who\": {", "\"a\": {\"b\": 1}}, \"n\": -2.5e3, \"z\": null}", r, why, sizeof why) == 1);
    CHECK(kv_task_json_check("{\"who\": ", "[1], \"n\": 1, \"z\": null}", r, why, sizeof why) == 0);
    kv_json_free(r);
}

static void test_code_program(void) {
    char *p = kv_task_code_program("def add(a, b):\n", "    return a + b\n\nprint('junk')\ndef other():\n    pass\n",
                                   "assert add(2, 3) == 5");
    REQUIRE(p);
    CHECK(!strcmp(p, "def add(a, b):\n    return a + b\n\n\nassert add(2, 3) == 5\n"));
    free(p);
    /* a completion that continues the prompt's last line, with no trailing code */
    p = kv_task_code_program("def sq(x):\n    return", " x * x", "assert sq(3) == 9");
    REQUIRE(p);
    CHECK(!strcmp(p, "def sq(x):\n    return x * x\nassert sq(3) == 9\n"));
    free(p);
}

static int have_python(void) {
    if (access("/usr/bin/python3", X_OK) == 0 || access("/usr/local/bin/python3", X_OK) == 0) return 1;
    printf("  (skipped: no python3)\n");
    return 0;
}

static void test_run_python(void) {
    if (!have_python()) return;
    char why[300];
    int net = -1;
    CHECK(kv_task_run_python("def f(x):\n    return x + 1\nassert f(1) == 2\n", 10, &net, why, sizeof why) == 1);
    CHECK(net == 0 || net == 1);
    CHECK(kv_task_run_python("def f(x):\n    return x\nassert f(1) == 2, 'wrong'\n", 10, NULL, why, sizeof why) == 0 &&
          strstr(why, "AssertionError"));
    CHECK(kv_task_run_python("def f(x)\n    return x\n", 10, NULL, why, sizeof why) == 0 && strstr(why, "SyntaxError"));
    CHECK(kv_task_run_python("while True:\n    pass\n", 0.5, NULL, why, sizeof why) == 0 && strstr(why, "timed out"));
    /* -I: no user site, no environment; the cwd is a fresh directory */
    CHECK(kv_task_run_python("import os\nassert not os.listdir('.') or os.listdir('.') == ['prog.py'] or "
                             "sorted(os.listdir('.')) == ['prog.py', 'stderr.txt']\nassert 'KVTOP_SHARED' not in "
                             "os.environ\nopen('made.txt', 'w').write('x')\n",
                             10, NULL, why, sizeof why) == 1);
    /* the temp directories are gone */
    const char *base = getenv("TMPDIR");
    DIR *d = opendir(base && *base ? base : "/tmp");
    REQUIRE(d);
    struct dirent *e;
    int left = 0;
    char mine[64];
    snprintf(mine, sizeof mine, "kvtop-task-");
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, mine, strlen(mine))) left++;
    closedir(d);
    CHECKF(left == 0, "%d kvtop-task-* directories left", left);
}

static void test_parse(void) {
    kv_task_set s;
    kv_err err = {0};
    const char *ok = "{\"id\": \"a\", \"prompt\": \"p\", \"prefix\": \"{\", \"required\": {\"k\": \"string\"}}\n\n"
                     "{\"id\": \"b\", \"prompt\": \"q\", \"required\": {\"n\": \"number\"}, \"max_tokens\": 20}\n";
    REQUIRE(kv_task_set_parse(ok, strlen(ok), "j.jsonl", KV_TASK_JSON, &s, &err) == 0);
    CHECK(s.n == 2 && !strcmp(s.tasks[0].prefix, "{") && s.tasks[0].max_tokens == 64 && s.tasks[1].max_tokens == 20 &&
          !strcmp(s.tasks[1].prefix, ""));
    kv_task_set_free(&s);
    CHECK(s.n == 0 && s.tasks == NULL);
    struct {
        const char *text, *want;
        kv_task_kind kind;
    } bad[] = {
        {"{\"id\": \"a\", \"prompt\": \"p\", \"required\": {\"k\": \"str\"}}\n", "j.jsonl:1", KV_TASK_JSON},
        {"\n{\"id\": \"a\", \"prompt\": \"p\"}\n", "j.jsonl:2", KV_TASK_JSON},
        {"{\"id\": \"\", \"prompt\": \"p\", \"tests\": \"assert 1\"}\n", "id", KV_TASK_CODE},
        {"{\"id\": \"a\", \"prompt\": \"p\"}\n", "tests", KV_TASK_CODE},
        {"{\"id\": \"a\", \"prompt\": \"p\", \"tests\": \"t\", \"max_tokens\": 0}\n", "max_tokens", KV_TASK_CODE},
        {"{\"id\": \"a\", \"prompt\": \"p\", \"tests\": \"t\"\n", "j.jsonl:1", KV_TASK_CODE},
        {"[1]\n", "object", KV_TASK_CODE},
        {"\n\n", "no tasks", KV_TASK_CODE},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&err, 0, sizeof err);
        int rc = kv_task_set_parse(bad[i].text, strlen(bad[i].text), "j.jsonl", bad[i].kind, &s, &err);
        CHECKF(rc < 0 && strstr(err.msg, bad[i].want) && s.n == 0, "case %zu: rc %d, '%s'", i, rc, err.msg);
    }
}

static void test_shipped_sets(void) {
    const char *files[] = {"data/eval/tasks/json.jsonl", "data/eval/tasks/code.jsonl"};
    for (int k = 0; k < 2; k++) {
        size_t n;
        char *buf = harness_read_file(files[k], &n);
        REQUIRE(buf);
        kv_task_set s;
        kv_err err = {0};
        CHECKF(kv_task_set_parse(buf, n, files[k], k ? KV_TASK_CODE : KV_TASK_JSON, &s, &err) == 0, "%s", err.msg);
        CHECK(s.n >= 8);
        /* each code task's tests pass with its reference solution (the
         * "solution" member): the tasks themselves are right */
        for (int i = 0; k == 1 && i < s.n && have_python(); i++) {
            const kv_json *sol = kv_json_get((const kv_json *)s.docs[i], "solution");
            REQUIRE(sol);
            char *prog = kv_task_code_program(s.tasks[i].prompt, kv_json_str(sol, NULL), s.tasks[i].tests);
            char why[300];
            CHECKF(kv_task_run_python(prog, 10, NULL, why, sizeof why) == 1, "%s: %s", s.tasks[i].id, why);
            free(prog);
        }
        kv_task_set_free(&s);
        free(buf);
    }
}

TEST_MAIN(T(test_json_check), T(test_code_program), T(test_run_python), T(test_parse), T(test_shipped_sets))
