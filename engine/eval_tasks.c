/* eval_tasks.c - task sets and scorers for `kvtop eval --tasks`
 * (eval_tasks.h): the JSONL task files, the JSON schema check, the code
 * program and its sandboxed python3 run. */
#include "eval_tasks.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../base/vec.h"

/* ---- task files ---- */

static const char *const type_names[] = {"string", "number", "integer", "boolean", "array", "object", "null", NULL};

static int type_known(const char *t) {
    for (int i = 0; type_names[i]; i++)
        if (!strcmp(t, type_names[i])) return 1;
    return 0;
}

static const char *str_member(const kv_json *o, const char *key) {
    const kv_json *v = kv_json_get(o, key);
    return kv_json_type_of(v) == KV_JSON_STRING ? kv_json_str(v, NULL) : NULL;
}

/* Fills t from line object o. Returns NULL or what is wrong. */
static const char *task_from(const kv_json *o, kv_task_kind kind, kv_task *t) {
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->max_tokens = 64;
    if (kv_json_type_of(o) != KV_JSON_OBJECT) return "not a JSON object";
    t->id = str_member(o, "id");
    t->prompt = str_member(o, "prompt");
    if (!t->id || !t->id[0]) return "\"id\" must be a non-empty string";
    if (!t->prompt || !t->prompt[0]) return "\"prompt\" must be a non-empty string";
    const kv_json *mt = kv_json_get(o, "max_tokens");
    if (mt) {
        double v = kv_json_number(mt);
        if (kv_json_type_of(mt) != KV_JSON_NUMBER || v != (int)v || v < 1 || v > 4096)
            return "\"max_tokens\" must be an integer in [1, 4096]";
        t->max_tokens = (int)v;
    }
    if (kind == KV_TASK_JSON) {
        const kv_json *pre = kv_json_get(o, "prefix");
        if (pre && kv_json_type_of(pre) != KV_JSON_STRING) return "\"prefix\" must be a string";
        t->prefix = pre ? kv_json_str(pre, NULL) : "";
        t->required = kv_json_get(o, "required");
        if (kv_json_type_of(t->required) != KV_JSON_OBJECT || kv_json_len(t->required) == 0)
            return "\"required\" must be a non-empty object of key: type";
        for (size_t i = 0; i < kv_json_len(t->required); i++) {
            const kv_json *ty = kv_json_at(t->required, i);
            if (kv_json_type_of(ty) != KV_JSON_STRING || !type_known(kv_json_str(ty, NULL)))
                return "\"required\" types must be string, number, integer, boolean, array, object or null";
        }
    } else {
        t->tests = str_member(o, "tests");
        if (!t->tests || !t->tests[0]) return "\"tests\" must be a non-empty string";
    }
    return NULL;
}

int kv_task_set_parse(const char *buf, size_t len, const char *name, kv_task_kind kind, kv_task_set *out,
                      kv_err *err) {
    memset(out, 0, sizeof *out);
    kv_task_set s = {0};
    int cap = 0, cap_docs = 0, line = 0;
    for (size_t i = 0; i < len;) {
        line++;
        const char *p = buf + i;
        const char *nl = memchr(p, '\n', len - i);
        size_t n = nl ? (size_t)(nl - p) : len - i;
        i += n + (nl != NULL);
        size_t k = 0;
        while (k < n && (p[k] == ' ' || p[k] == '\t' || p[k] == '\r')) k++;
        if (k == n) continue;
        if (kv_grow((void **)&s.tasks, &cap, s.n + 1, sizeof *s.tasks) ||
            kv_grow((void **)&s.docs, &cap_docs, s.n + 1, sizeof *s.docs)) {
            kv_err_set(err, KV_ERR_NOMEM, "%s: out of memory", name);
            goto fail;
        }
        kv_json *d = kv_json_parse_named(p, n, name, line, err);
        if (!d) goto fail;
        s.docs[s.n] = d;
        const char *bad = task_from(d, kind, &s.tasks[s.n]);
        s.n++;
        if (bad) {
            kv_err_set(err, KV_ERR_FORMAT, "%s:%d: %s", name, line, bad);
            goto fail;
        }
    }
    if (s.n == 0) {
        kv_err_set(err, KV_ERR_FORMAT, "%s: no tasks", name);
        goto fail;
    }
    *out = s;
    return 0;
fail:
    kv_task_set_free(&s);
    return err->code ? err->code : KV_ERR_FORMAT;
}

void kv_task_set_free(kv_task_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) kv_json_free(s->docs[i]);
    free(s->docs);
    free(s->tasks);
    memset(s, 0, sizeof *s);
}

/* ---- the JSON scorer ---- */

/* The end (one past the matching '}') of the object starting at s[0] ==
 * '{', or NULL when it does not close. */
static const char *object_end(const char *s) {
    int depth = 0, in_str = 0;
    for (const char *p = s; *p; p++) {
        if (in_str) {
            if (*p == '\\' && p[1]) p++;
            else if (*p == '"') in_str = 0;
        } else if (*p == '"') {
            in_str = 1;
        } else if (*p == '{' || *p == '[') {
            depth++;
        } else if (*p == '}' || *p == ']') {
            if (--depth == 0) return p + 1;
            if (depth < 0) return NULL;
        }
    }
    return NULL;
}

static int type_matches(const kv_json *v, const char *t) {
    kv_json_type k = kv_json_type_of(v);
    if (!strcmp(t, "string")) return k == KV_JSON_STRING;
    if (!strcmp(t, "number")) return k == KV_JSON_NUMBER;
    if (!strcmp(t, "integer")) return k == KV_JSON_NUMBER && kv_json_number(v) == (double)(long long)kv_json_number(v);
    if (!strcmp(t, "boolean")) return k == KV_JSON_BOOL;
    if (!strcmp(t, "array")) return k == KV_JSON_ARRAY;
    if (!strcmp(t, "object")) return k == KV_JSON_OBJECT;
    return k == KV_JSON_NULL && !strcmp(t, "null");
}

int kv_task_json_check(const char *prefix, const char *answer, const kv_json *required, char *why, size_t cap) {
    size_t lp = strlen(prefix), la = strlen(answer);
    char *all = malloc(lp + la + 1);
    if (!all) {
        snprintf(why, cap, "out of memory");
        return 0;
    }
    memcpy(all, prefix, lp);
    memcpy(all + lp, answer, la + 1);
    int ok = 0;
    const char *start = strchr(all, '{'), *end = start ? object_end(start) : NULL;
    if (!start) {
        snprintf(why, cap, "no '{' in the answer");
        goto done;
    }
    if (!end) {
        snprintf(why, cap, "the object does not close");
        goto done;
    }
    kv_err err = {0};
    kv_json *d = kv_json_parse(start, (size_t)(end - start), &err);
    if (!d) {
        snprintf(why, cap, "does not parse: %s", err.msg);
        goto done;
    }
    ok = 1;
    for (size_t i = 0; ok && i < kv_json_len(required); i++) {
        const char *key = kv_json_key_at(required, i, NULL), *t = kv_json_str(kv_json_at(required, i), NULL);
        const kv_json *v = kv_json_get(d, key);
        if (!v) snprintf(why, cap, "no key \"%s\"", key), ok = 0;
        else if (!type_matches(v, t)) snprintf(why, cap, "\"%s\" is not a %s", key, t), ok = 0;
    }
    if (ok) why[0] = 0;
    kv_json_free(d);
done:
    free(all);
    return ok;
}

/* ---- code ---- */

char *kv_task_code_program(const char *prompt, const char *completion, const char *tests) {
    /* the body ends at the first non-blank line starting in column 0 */
    size_t keep = strlen(completion);
    const char *p = completion;
    int first = 1; /* the completion's first line continues the prompt's last */
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        int blank = 1;
        for (size_t i = 0; i < n; i++)
            if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r') blank = 0;
        if (!first && !blank && p[0] != ' ' && p[0] != '\t') {
            keep = (size_t)(p - completion);
            break;
        }
        first = 0;
        if (!nl) break;
        p = nl + 1;
    }
    size_t lp = strlen(prompt), lt = strlen(tests);
    char *out = malloc(lp + keep + lt + 3);
    if (!out) return NULL;
    memcpy(out, prompt, lp);
    memcpy(out + lp, completion, keep);
    out[lp + keep] = '\n';
    memcpy(out + lp + keep + 1, tests, lt);
    out[lp + keep + 1 + lt] = '\n';
    out[lp + keep + lt + 2] = 0;
    return out;
}

static int write_all(const char *path, const char *s) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    size_t n = strlen(s);
    int ok = fwrite(s, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* The child: limits, a fresh network namespace when allowed, then python3.
 * Never returns. */
static void child_exec(const char *dir, double timeout_s, int err_fd) {
    if (chdir(dir) != 0) _exit(126);
    int null = open("/dev/null", O_RDWR);
    if (null < 0) _exit(126);
    dup2(null, 0);
    dup2(null, 1);
    dup2(err_fd, 2);
    struct rlimit cpu = {(rlim_t)timeout_s + 1, (rlim_t)timeout_s + 2};
    struct rlimit as = {512ull << 20, 512ull << 20}, fsz = {1 << 20, 1 << 20}, nof = {64, 64};
    setrlimit(RLIMIT_CPU, &cpu);
    setrlimit(RLIMIT_AS, &as);
    setrlimit(RLIMIT_FSIZE, &fsz);
    setrlimit(RLIMIT_NOFILE, &nof);
    setrlimit(RLIMIT_CORE, &(struct rlimit){0, 0});
    (void)unshare(CLONE_NEWNET); /* the parent checked whether this works */
    char home[1100];
    snprintf(home, sizeof home, "HOME=%s", dir);
    char *const env[] = {"PATH=/usr/local/bin:/usr/bin:/bin", home, "PYTHONDONTWRITEBYTECODE=1", NULL};
    char *const args[] = {"python3", "-I", "-S", "-B", "prog.py", NULL};
    execve("/usr/bin/python3", args, env);
    execve("/usr/local/bin/python3", args, env);
    _exit(127);
}

/* Whether this process may make a network namespace (tried in a child). */
static int can_isolate_net(void) {
    static int known = -1;
    if (known >= 0) return known;
    pid_t pid = fork();
    if (pid < 0) return known = 0;
    if (pid == 0) _exit(unshare(CLONE_NEWNET) == 0 ? 0 : 1);
    int st = 0;
    waitpid(pid, &st, 0);
    return known = WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* The last non-empty line of file path into why. */
static void last_line(const char *path, char *why, size_t cap) {
    FILE *f = fopen(path, "r");
    char line[512], last[512] = "";
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (line[0]) snprintf(last, sizeof last, "%s", line);
    }
    fclose(f);
    if (last[0]) snprintf(why, cap, "%s", last);
}

static void remove_dir(const char *dir) {
    const char *names[] = {"prog.py", "stderr.txt"};
    char p[1200];
    for (size_t i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    /* what the program made itself goes with it */
    if (rmdir(dir) != 0 && (errno == ENOTEMPTY || errno == EEXIST)) {
        pid_t pid = fork();
        if (pid == 0) {
            execl("/bin/rm", "rm", "-rf", "--", dir, (char *)NULL);
            _exit(127);
        }
        if (pid > 0) waitpid(pid, NULL, 0);
    }
}

int kv_task_run_python(const char *program, double timeout_s, int *isolated_net, char *why, size_t cap) {
    why[0] = 0;
    if (isolated_net) *isolated_net = can_isolate_net();
    const char *base = getenv("TMPDIR");
    char dir[1024], path[1100], errp[1100];
    snprintf(dir, sizeof dir, "%s/kvtop-task-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(dir)) {
        snprintf(why, cap, "cannot make a temp directory: %s", strerror(errno));
        return KV_ERR_IO;
    }
    snprintf(path, sizeof path, "%s/prog.py", dir);
    snprintf(errp, sizeof errp, "%s/stderr.txt", dir);
    int rc = KV_ERR_IO;
    int err_fd = -1;
    if (write_all(path, program) != 0 || (err_fd = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600)) < 0) {
        snprintf(why, cap, "cannot write the program: %s", strerror(errno));
        goto done;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, cap, "fork: %s", strerror(errno));
        goto done;
    }
    if (pid == 0) child_exec(dir, timeout_s, err_fd);
    close(err_fd);
    err_fd = -1;
    int st = 0, timed_out = 0;
    struct timespec t0, t1, nap = {0, 5 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) break;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9 > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            timed_out = 1;
            break;
        }
        nanosleep(&nap, NULL);
    }
    if (timed_out) {
        snprintf(why, cap, "timed out after %g s", timeout_s);
        rc = 0;
    } else if (WIFEXITED(st) && WEXITSTATUS(st) == 127) {
        snprintf(why, cap, "python3 not found");
        rc = KV_ERR_UNSUPPORTED;
    } else if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        rc = 1;
    } else {
        if (WIFSIGNALED(st)) snprintf(why, cap, "killed by signal %d", WTERMSIG(st));
        else snprintf(why, cap, "exit %d", WEXITSTATUS(st));
        last_line(errp, why, cap);
        rc = 0;
    }
done:
    if (err_fd >= 0) close(err_fd);
    remove_dir(dir);
    return rc;
}
