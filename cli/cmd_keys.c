/* cmd_keys.c - `kvtop keys [PROFILE] [--set k=v ...]`: with no profile,
 * every profile key with its type, range, default and meaning (the one key
 * table YAML, --set and validation share); with one, that profile as it
 * resolves (overrides applied, defaults filled in, validated) in YAML that
 * loads back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../profiles/profile.h"
#include "cli.h"
#include "commands.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kvtop keys                          every profile key: type, range, meaning\n"
               "       kvtop keys PROFILE [--set k=v ...]  the profile as it resolves, as YAML\n"
               "Exit status: 0 ok, 2 usage error or a bad profile.\n");
}

int cmd_keys(int argc, char **argv) {
    const char *profile = NULL;
    const char **sets = calloc((size_t)argc + 1, sizeof *sets);
    if (!sets) return 1;
    int n_sets = 0, rc = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            rc = 0;
            goto done;
        } else if (!strncmp(a, "--set=", 6)) {
            sets[n_sets++] = a + 6;
        } else if (!strcmp(a, "--set")) {
            if (cli_str(argc, argv, &i, &sets[n_sets++])) goto done;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "kvtop keys: unknown option '%s'\n", a);
            usage(stderr);
            goto done;
        } else if (!profile) {
            profile = a;
        } else {
            fprintf(stderr, "kvtop keys: more than one profile given ('%s' and '%s')\n", profile, a);
            goto done;
        }
    }
    if (!profile) {
        if (n_sets) {
            fprintf(stderr, "kvtop keys: --set needs a profile\n");
            goto done;
        }
        kv_profile_print_keys(stdout);
        rc = 0;
        goto done;
    }
    kv_config cfg;
    kv_err err = {0};
    if (kv_profile_load_with_sets(profile, sets, n_sets, &cfg, &err)) {
        fprintf(stderr, "kvtop keys: %s\n", err.msg);
        goto done;
    }
    rc = kv_profile_dump(&cfg, stdout) ? 1 : 0;
done:
    free(sets);
    return rc;
}
