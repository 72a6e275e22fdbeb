/* test_request.c - the server's request parser: every field of the OpenAI
 * bodies, and the 400 (naming the field) for unknown fields, wrong types,
 * values outside the key table's ranges, unsupported features, malformed
 * JSON and invalid UTF-8; plus the constant-time key comparison. */
#include <string.h>

#include "../harness.h"
#include "../../server/http.h"
#include "../../server/request.h"

static kv_sampling defaults(void) {
    kv_config c;
    kv_config_default(&c);
    return c.sampling;
}

/* Parses body as a chat (or completions) request; returns the status (200
 * when it parsed) and leaves the parsed request in *r when it did. */
static int parse(const char *body, srv_kind kind, srv_gen_req *r, srv_error *e) {
    kv_sampling d = defaults();
    memset(e, 0, sizeof *e);
    if (srv_parse_gen(body, strlen(body), kind, &d, r, e)) return e->status;
    return 200;
}

/* The status of body, the request freed; *param gets the field at fault. */
static int status_of(const char *body, srv_kind kind, char *param, size_t cap) {
    srv_gen_req r;
    srv_error e;
    int st = parse(body, kind, &r, &e);
    if (st == 200) srv_gen_req_free(&r);
    if (param) kv_copy_str(param, cap, st == 200 ? "" : e.param);
    return st;
}

static void test_chat_fields(void) {
    srv_gen_req r;
    srv_error e;
    const char *b = "{\"model\": \"m\", \"messages\": [{\"role\": \"system\", \"content\": \"be brief\"},"
                    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]},"
                    "{\"role\": \"assistant\", \"content\": null}, {\"role\": \"developer\", \"content\": \"x\"}],"
                    "\"max_tokens\": 7, \"temperature\": 0, \"top_p\": 0.5, \"top_k\": -1, \"min_p\": 0.1, \"seed\": 42,"
                    "\"stop\": [\"\\n\", \"END\"], \"stream\": true, \"stream_options\": {\"include_usage\": true},"
                    "\"n\": 2, \"priority\": 3, \"ignore_eos\": true, \"logprobs\": false, \"user\": \"u\","
                    "\"presence_penalty\": 0, \"parse_special\": true, \"repetition_penalty\": 1.2}";
    REQUIRE(parse(b, SRV_CHAT, &r, &e) == 200);
    CHECK(!strcmp(r.model, "m"));
    CHECK(r.n_msgs == 4);
    CHECK(!strcmp(r.msgs[1].content, "ab") && r.msgs[1].len == 2);
    CHECK(!strcmp(r.msgs[2].role, "assistant") && r.msgs[2].content[0] == 0);
    CHECK(!strcmp(r.msgs[3].role, "system"));
    CHECK(r.max_tokens == 7 && r.sampling.temperature == 0 && r.sampling.top_p == 0.5f && r.sampling.top_k == 0);
    CHECK(r.has_seed && r.sampling.seed == 42);
    CHECK(r.n_stop == 2 && !strcmp(r.stop[1], "END"));
    CHECK(r.stream && r.include_usage && r.n == 2 && r.priority == 3 && r.ignore_eos && r.parse_special);
    CHECK(r.sampling.repeat_penalty == 1.2f);
    CHECK(!r.logprobs && r.top_logprobs == 0);
    srv_gen_req_free(&r);
    REQUIRE(parse("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logprobs\": true, \"top_logprobs\": 20}",
                  SRV_CHAT, &r, &e) == 200);
    CHECK(r.logprobs && r.top_logprobs == 20);
    srv_gen_req_free(&r);
    REQUIRE(parse("{\"prompt\": \"x\", \"logprobs\": 0}", SRV_COMPLETION, &r, &e) == 200);
    CHECK(r.logprobs && r.top_logprobs == 0);
    srv_gen_req_free(&r);
    /* defaults: the profile's sampling, no seed, max_tokens absent */
    REQUIRE(parse("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_completion_tokens\": 3}", SRV_CHAT,
                  &r, &e) == 200);
    kv_sampling d = defaults();
    CHECK(r.sampling.temperature == d.temperature && !r.has_seed && r.max_tokens == 3 && r.n == 1 && !r.stream);
    srv_gen_req_free(&r);
}

static void test_completion_prompts(void) {
    srv_gen_req r;
    srv_error e;
    REQUIRE(parse("{\"prompt\": \"Once upon\", \"echo\": true}", SRV_COMPLETION, &r, &e) == 200);
    CHECK(r.n_prompts == 1 && !strcmp(r.prompts[0].text, "Once upon") && r.echo && r.max_tokens == -1);
    srv_gen_req_free(&r);
    REQUIRE(parse("{\"prompt\": [\"a\", \"b\", [1, 2, 3]]}", SRV_COMPLETION, &r, &e) == 200);
    CHECK(r.n_prompts == 3 && !strcmp(r.prompts[1].text, "b") && r.prompts[2].n_ids == 3 && r.prompts[2].ids[2] == 3);
    srv_gen_req_free(&r);
    REQUIRE(parse("{\"prompt\": [5, 6]}", SRV_COMPLETION, &r, &e) == 200);
    CHECK(r.n_prompts == 1 && r.prompts[0].n_ids == 2 && r.prompts[0].ids[0] == 5);
    srv_gen_req_free(&r);
}

static void test_rejections(void) {
    char p[96];
    const char *hi = "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]";
    char b[512];
    struct {
        const char *extra; /* appended after the messages */
        const char *param; /* the field the 400 names */
    } cases[] = {
        {", \"temperature\": -3", "temperature"},      /* below sampling.temperature's 0 */
        {", \"temperature\": 101", "temperature"},     /* above its 100 */
        {", \"temperature\": \"hot\"", "temperature"}, /* wrong type */
        {", \"top_p\": 0", "top_p"},                   /* (0, 1]: open at 0 */
        {", \"min_p\": 1", "min_p"},                   /* [0, 1): open at 1 */
        {", \"top_k\": 1.5", "top_k"},
        {", \"max_tokens\": 1e308", "max_tokens"},
        {", \"max_tokens\": -5", "max_tokens"},
        {", \"max_tokens\": 0", "max_tokens"},
        {", \"max_tokens\": 2.5", "max_tokens"},
        {", \"seed\": -1", "seed"},
        {", \"stop\": [1, 2]", "stop[0]"},
        {", \"stop\": [\"\"]", "stop[0]"},
        {", \"stream\": 1", "stream"},
        {", \"n\": 0", "n"},
        {", \"n\": 17", "n"},
        {", \"logprobs\": 1", "logprobs"},
        {", \"top_logprobs\": 3", "top_logprobs"},      /* without logprobs */
        {", \"logprobs\": true, \"top_logprobs\": 21", "top_logprobs"},
        {", \"logprobs\": true, \"top_logprobs\": -1", "top_logprobs"},
        {", \"logprobs\": true, \"top_logprobs\": 2.5", "top_logprobs"},
        {", \"tools\": [{\"type\": \"function\"}]", "tools"},
        {", \"frequency_penalty\": 0.5", "frequency_penalty"},
        {", \"logit_bias\": {\"1\": 5}", "logit_bias"},
        {", \"response_format\": {\"type\": \"json_object\"}", "response_format"},
        {", \"stream_options\": {\"include_usage\": true}", "stream_options"}, /* without stream */
        {", \"bogus\": 1", "bogus"},
        {", \"stream_options\": {\"bogus\": 1}", "stream_options.bogus"},
    };
    for (size_t i = 0; i < KV_ARRAY_LEN(cases); i++) {
        snprintf(b, sizeof b, "{%s%s}", hi, cases[i].extra);
        int st = status_of(b, SRV_CHAT, p, sizeof p);
        CHECKF(st == 400 && !strcmp(p, cases[i].param), "%s: status %d, param '%s'", cases[i].extra, st, p);
    }
    struct {
        const char *body;
        const char *param;
    } whole[] = {
        {"{\"messages\": 5}", "messages"},
        {"{\"messages\": []}", "messages"},
        {"{\"messages\": [{\"role\": \"user\"}]}", "messages[0].content"},
        {"{\"messages\": [{\"content\": \"x\"}]}", "messages[0].role"},
        {"{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", "messages[0].role"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"mood\": 1}]}", "messages[0].mood"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", "messages[0].content[0].type"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\\u0000b\"}]}", "messages[0].content"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": null}]}", "messages[0].content"},
        {"{\"model\": \"m\"}", "messages"},
    };
    for (size_t i = 0; i < KV_ARRAY_LEN(whole); i++) {
        int st = status_of(whole[i].body, SRV_CHAT, p, sizeof p);
        CHECKF(st == 400 && !strcmp(p, whole[i].param), "%s: status %d, param '%s'", whole[i].body, st, p);
    }
    /* malformed documents: 400 without a field */
    const char *bad[] = {"", "{", "[]", "null", "{\"messages\": [", "{\"a\":1,}", "{\"messages\": \"\xff\xfe\"}"};
    for (size_t i = 0; i < KV_ARRAY_LEN(bad); i++) CHECKF(status_of(bad[i], SRV_CHAT, NULL, 0) == 400, "body %zu", i);
    /* completions: its own fields */
    CHECK(status_of("{\"prompt\": {\"a\": 1}}", SRV_COMPLETION, p, sizeof p) == 400 && !strcmp(p, "prompt"));
    CHECK(status_of("{\"prompt\": [1, -2]}", SRV_COMPLETION, p, sizeof p) == 400 && !strcmp(p, "prompt[1]"));
    CHECK(status_of("{\"prompt\": \"x\", \"logprobs\": 21}", SRV_COMPLETION, p, sizeof p) == 400 && !strcmp(p, "logprobs"));
    CHECK(status_of("{\"prompt\": \"x\", \"logprobs\": true}", SRV_COMPLETION, p, sizeof p) == 400 && !strcmp(p, "logprobs"));
    CHECK(status_of("{\"prompt\": \"x\", \"logprobs\": 2, \"echo\": true}", SRV_COMPLETION, p, sizeof p) == 400 &&
          !strcmp(p, "logprobs"));
    CHECK(status_of("{\"prompt\": \"x\", \"best_of\": 3}", SRV_COMPLETION, p, sizeof p) == 400 && !strcmp(p, "best_of"));
    CHECK(status_of("{\"prompt\": \"x\", \"messages\": []}", SRV_COMPLETION, p, sizeof p) == 400 && !strcmp(p, "messages"));
    CHECK(status_of("{\"prompt\": \"x\", \"n\": 16}", SRV_COMPLETION, NULL, 0) == 200);
    CHECK(status_of("{\"prompt\": [\"a\",\"b\",\"c\",\"d\",\"e\"], \"n\": 16}", SRV_COMPLETION, p, sizeof p) == 400 &&
          !strcmp(p, "n"));
    CHECK(status_of("{\"prompt\": \"x\", \"echo\": true, \"stream\": true}", SRV_COMPLETION, p, sizeof p) == 400);
}

static void test_other_bodies(void) {
    srv_tok_req t;
    srv_error e;
    const char *b = "{\"prompt\": \"hello\", \"add_special_tokens\": false}";
    REQUIRE(srv_parse_tokenize(b, strlen(b), &t, &e) == 0);
    CHECK(!strcmp(t.prompt, "hello") && !t.add_special && !t.parse_special);
    srv_tok_req_free(&t);
    b = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"add_generation_prompt\": false}";
    REQUIRE(srv_parse_tokenize(b, strlen(b), &t, &e) == 0);
    CHECK(t.n_msgs == 1 && !t.add_generation_prompt);
    srv_tok_req_free(&t);
    b = "{}";
    CHECK(srv_parse_tokenize(b, strlen(b), &t, &e) == -1 && e.status == 400);
    srv_detok_req d;
    b = "{\"tokens\": [1, 2, 3]}";
    REQUIRE(srv_parse_detokenize(b, strlen(b), &d, &e) == 0);
    CHECK(d.n_ids == 3 && d.ids[1] == 2);
    srv_detok_req_free(&d);
    b = "{\"tokens\": [1, \"x\"]}";
    CHECK(srv_parse_detokenize(b, strlen(b), &d, &e) == -1 && !strcmp(e.param, "tokens[1]"));
    srv_ctl_req c;
    b = "{\"action\": \"slow\", \"delay_ms\": 50}";
    REQUIRE(srv_parse_control(b, strlen(b), &c, &e) == 0);
    CHECK(c.action == SRV_CTL_SLOW && c.delay_ms == 50);
    b = "{\"action\": \"slow\"}";
    CHECK(srv_parse_control(b, strlen(b), &c, &e) == -1 && !strcmp(e.param, "delay_ms"));
    b = "{\"action\": \"slow\", \"delay_ms\": 60001}"; /* ui.step_delay_ms's range */
    CHECK(srv_parse_control(b, strlen(b), &c, &e) == -1 && !strcmp(e.param, "delay_ms"));
    b = "{\"action\": \"explode\"}";
    CHECK(srv_parse_control(b, strlen(b), &c, &e) == -1 && !strcmp(e.param, "action"));
}

static void test_key_equal(void) {
    CHECK(srv_key_equal("secret", 6, "secret"));
    CHECK(!srv_key_equal("secreT", 6, "secret"));
    CHECK(!srv_key_equal("secret2", 7, "secret"));
    CHECK(!srv_key_equal("secre", 5, "secret"));
    CHECK(!srv_key_equal("", 0, "secret"));
    CHECK(!srv_key_equal("", 0, "")); /* no key configured is never "equal" */
    CHECK(!srv_key_equal("secretsecret", 12, "secret")); /* the cyclic walk does not accept repeats */
}

TEST_MAIN(T(test_chat_fields), T(test_completion_prompts), T(test_rejections), T(test_other_bodies), T(test_key_equal))
