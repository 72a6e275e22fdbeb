/* test_same_file.c - kv_same_file, the check that keeps an output path off
 * a command's inputs: the same file by any spelling, a hard link or a
 * symbolic link is the same; another file, a missing one or NULL is not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../harness.h"
#include "../../base/file.h"

static void test_same_file(void) {
    char dir[] = "/tmp/kvtop-same-XXXXXX";
    REQUIRE(mkdtemp(dir));
    char a[256], hard[256], soft[256], other[256], dotted[300], missing[256];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(hard, sizeof hard, "%s/hard", dir);
    snprintf(soft, sizeof soft, "%s/soft", dir);
    snprintf(other, sizeof other, "%s/other", dir);
    snprintf(dotted, sizeof dotted, "%s/./a", dir);
    snprintf(missing, sizeof missing, "%s/missing", dir);
    FILE *f = fopen(a, "w");
    REQUIRE(f);
    fputs("x", f);
    fclose(f);
    f = fopen(other, "w");
    REQUIRE(f);
    fputs("x", f); /* the same bytes: contents do not matter */
    fclose(f);
    REQUIRE(link(a, hard) == 0 && symlink(a, soft) == 0);
    CHECK(kv_same_file(a, a) == 1);
    CHECK(kv_same_file(a, dotted) == 1);
    CHECK(kv_same_file(a, hard) == 1 && kv_same_file(hard, a) == 1);
    CHECK(kv_same_file(soft, a) == 1);
    CHECK(kv_same_file(a, other) == 0);
    CHECK(kv_same_file(a, missing) == 0 && kv_same_file(missing, missing) == 0);
    CHECK(kv_same_file(NULL, a) == 0 && kv_same_file(a, NULL) == 0);
    unlink(a), unlink(hard), unlink(soft), unlink(other);
    rmdir(dir);
}

TEST_MAIN(T(test_same_file))
