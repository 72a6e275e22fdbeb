/* test_secret.c - secret keys (server.api_key): flagged in the key table,
 * shown as *** by the config dump that `kvtop keys`, bench reports and
 * trace headers use, and "***" refused as a value so a redacted dump never
 * loads back as a key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/config.h"
#include "../../profiles/profile.h"
#include "../harness.h"

/* kv_profile_dump(c) as a malloc'd string (NULL on failure). */
static char *dump(const kv_config *c) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    int rc = kv_profile_dump(c, f);
    fclose(f);
    if (rc) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void test_secret_flag(void) {
    const kv_config_key *k = kv_config_key_find("server.api_key");
    REQUIRE(k);
    CHECK(k->flags & KV_KEY_SECRET);
    int n, secrets = 0;
    const kv_config_key *keys = kv_config_keys(&n);
    for (int i = 0; i < n; i++) {
        secrets += (keys[i].flags & KV_KEY_SECRET) != 0;
        CHECKF(!(keys[i].flags & KV_KEY_SECRET) || keys[i].type == KV_KEY_STRING, "%s: secret but not a string",
               keys[i].path);
    }
    CHECK(secrets >= 1);
    kv_config c;
    kv_config_default(&c);
    CHECK(!strcmp(kv_config_key_shown(k, &c), ""));
    kv_copy_str(c.server.api_key, sizeof c.server.api_key, "sekrit-42");
    CHECK(!strcmp(kv_config_key_shown(k, &c), KV_SECRET_SHOWN));
    /* other strings show as they are */
    const kv_config_key *mp = kv_config_key_find("model.path");
    REQUIRE(mp);
    CHECK(!strcmp(kv_config_key_shown(mp, &c), c.model.path));
}

static void test_dump_redacts(void) {
    kv_config c;
    kv_config_default(&c);
    kv_err err;
    REQUIRE(kv_profile_set(&c, "server.api_key=sekrit-42", &err) == 0);
    CHECK(!strcmp(c.server.api_key, "sekrit-42"));
    char *y = dump(&c);
    REQUIRE(y);
    CHECKF(!strstr(y, "sekrit") && strstr(y, "  api_key: \"***\"\n"), "dump: %s", strstr(y, "api_key"));
    /* the redacted dump does not load back as a key: it fails naming the key */
    kv_config back;
    kv_config_default(&back);
    CHECK(kv_profile_load_mem(y, strlen(y), "dump", &back, &err) == KV_ERR_INVAL && strstr(err.msg, "server.api_key") &&
          strstr(err.msg, "***"));
    free(y);
    /* unset: an empty string, and the dump loads back */
    kv_config_default(&c);
    y = dump(&c);
    REQUIRE(y);
    CHECK(strstr(y, "  api_key: \"\"\n") != NULL);
    CHECK(kv_profile_load_mem(y, strlen(y), "dump", &back, &err) == 0 && back.server.api_key[0] == 0);
    free(y);
}

static void test_placeholder_refused(void) {
    kv_config c;
    kv_config_default(&c);
    kv_err err;
    REQUIRE(kv_profile_set(&c, "server.api_key=real", &err) == 0);
    CHECK(kv_profile_set(&c, "server.api_key=***", &err) == KV_ERR_INVAL && strstr(err.msg, "server.api_key"));
    CHECK(!strcmp(c.server.api_key, "real")); /* unchanged */
    const char *yaml = "server:\n  api_key: '***'\n";
    CHECK(kv_profile_load_mem(yaml, strlen(yaml), "p.yaml", &c, &err) == KV_ERR_INVAL);
    /* "***" is only refused for secrets */
    CHECK(kv_profile_set(&c, "model.tokenizer=***", &err) == 0 && !strcmp(c.model.tokenizer, "***"));
}

TEST_MAIN(T(test_secret_flag), T(test_dump_redacts), T(test_placeholder_refused))
