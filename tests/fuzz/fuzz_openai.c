/* libFuzzer target for OpenAI request parsing and response encoding.
 *
 * Each input is parsed as a /v1/completions body and as a
 * /v1/chat/completions body (n_vocab 32000). A rejection must be a 400 (or
 * a 500 for ENOMEM) with a message, leave nothing to free, and encode to
 * valid JSON. An accepted request must respect every range the parser
 * promises; its chat messages are then rendered with every template family,
 * and a response and stream chunks are encoded with the input bytes as the
 * model's text (ill-formed UTF-8 included): each output must parse back as
 * JSON. Violations are __builtin_trap so the fuzzer keeps them. */
#include "runtime/chat.h"
#include "runtime/openai.h"

#include <jansson.h>

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#define FUZZ_N_VOCAB 32000

#define FUZZ_CHECK(cond)                                                                                     \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            __builtin_trap();                                                                                \
    } while (0)

/* Valid JSON, or a trap; NUL bytes in strings are legal output. */
static void fuzz_check_json(const char *s, size_t n)
{
    FUZZ_CHECK(s != NULL);
    json_error_t je;
    json_t *j = json_loadb(s, n, JSON_ALLOW_NUL, &je);
    FUZZ_CHECK(j != NULL);
    json_decref(j);
}

static void fuzz_check_rejected(const rt_oai_request *r, const rt_oai_error *e, int rc)
{
    FUZZ_CHECK(rc == -EINVAL || rc == -ENOMEM);
    FUZZ_CHECK(e->status == (rc == -EINVAL ? 400 : 500));
    FUZZ_CHECK(e->type != NULL && e->message[0] != '\0');
    FUZZ_CHECK(memchr(e->message, '\0', sizeof(e->message)) != NULL);
    FUZZ_CHECK(r->model == NULL && r->prompt == NULL && r->prompt_tokens == NULL && r->messages == NULL);
    FUZZ_CHECK(r->n_messages == 0 && r->n_stop == 0 && r->user == NULL);
    char *j = rt_oai_error_json(e);
    fuzz_check_json(j, strlen(j));
    free(j);
}

static void fuzz_check_accepted(const rt_oai_request *r, bool chat)
{
    FUZZ_CHECK(r->chat == chat && r->model != NULL && r->model[0] != '\0');
    if (chat) {
        FUZZ_CHECK(r->n_messages > 0 && r->messages != NULL && r->prompt == NULL && r->prompt_tokens == NULL);
        for (int i = 0; i < r->n_messages; i++) {
            const char *role = r->messages[i].role;
            FUZZ_CHECK(strcmp(role, "system") == 0 || strcmp(role, "user") == 0 ||
                       strcmp(role, "assistant") == 0);
            FUZZ_CHECK(r->messages[i].content != NULL);
        }
    } else {
        FUZZ_CHECK(r->n_messages == 0 && r->messages == NULL);
        FUZZ_CHECK((r->prompt != NULL) != (r->prompt_tokens != NULL));
        if (r->prompt)
            FUZZ_CHECK(r->prompt[0] != '\0');
        else
            FUZZ_CHECK(r->n_prompt_tokens > 0);
        for (int i = 0; i < r->n_prompt_tokens; i++)
            FUZZ_CHECK(r->prompt_tokens[i] >= 0 && r->prompt_tokens[i] < FUZZ_N_VOCAB);
    }
    FUZZ_CHECK(r->max_tokens == -1 || r->max_tokens >= 1);
    FUZZ_CHECK(r->sampling.temperature >= 0.0f && r->sampling.temperature <= 2.0f);
    FUZZ_CHECK(r->sampling.top_p >= 0.0f && r->sampling.top_p <= 1.0f);
    FUZZ_CHECK(r->sampling.n_bias >= 0 && r->sampling.n_bias <= RT_SAMPLER_MAX_BIAS);
    for (int i = 0; i < r->sampling.n_bias; i++)
        FUZZ_CHECK(r->sampling.bias[i].token >= 0 && r->sampling.bias[i].token < FUZZ_N_VOCAB &&
                   r->sampling.bias[i].bias >= -100.0f && r->sampling.bias[i].bias <= 100.0f);
    FUZZ_CHECK(r->sampling.top_k >= 0);
    FUZZ_CHECK(r->sampling.min_p >= 0.0f && r->sampling.min_p <= 1.0f);
    FUZZ_CHECK(r->sampling.presence_penalty >= -2.0f && r->sampling.presence_penalty <= 2.0f);
    FUZZ_CHECK(r->sampling.frequency_penalty >= -2.0f && r->sampling.frequency_penalty <= 2.0f);
    FUZZ_CHECK(r->n_stop >= 0 && r->n_stop <= RT_OAI_MAX_STOPS);
    for (int i = 0; i < r->n_stop; i++)
        FUZZ_CHECK(r->stop[i] != NULL && r->stop[i][0] != '\0');
    FUZZ_CHECK(!r->include_usage || r->stream);
    FUZZ_CHECK(r->top_logprobs >= 0 && r->top_logprobs <= RT_OAI_MAX_TOP_LOGPROBS);
    FUZZ_CHECK(r->logprobs || r->top_logprobs == 0);
    FUZZ_CHECK(chat || !r->logprobs);
}

static void fuzz_render(const rt_oai_request *r)
{
    rt_chat_msg *msgs = malloc((size_t)r->n_messages * sizeof(*msgs));
    if (!msgs)
        return;
    for (int i = 0; i < r->n_messages; i++) {
        msgs[i].role = r->messages[i].role;
        msgs[i].content = r->messages[i].content;
    }
    for (int k = 0; k < RT_CHAT_N_KINDS; k++) {
        for (int with_bos = 0; with_bos < 2; with_bos++) {
            char *out = NULL, err[256];
            rt_text_span *sp = NULL;
            int n_sp = -1;
            err[0] = '\0';
            const rt_chat_opts co = {.no_thinking = r->no_thinking};
            int rc = rt_chat_render((rt_chat_kind)k, msgs, r->n_messages, with_bos ? "<s>" : NULL, &co, &out,
                                    &sp, &n_sp, err, sizeof(err));
            if (rc == 0) {
                FUZZ_CHECK(out != NULL && n_sp >= 0 && (n_sp == 0) == (sp == NULL));
                /* Content spans: non-empty, in order, apart, within the text. */
                size_t len = strlen(out), end = 0;
                for (int i = 0; i < n_sp; i++) {
                    FUZZ_CHECK(sp[i].len > 0 && sp[i].off <= len && sp[i].len <= len - sp[i].off);
                    FUZZ_CHECK(i == 0 || sp[i].off > end);
                    end = sp[i].off + sp[i].len;
                }
                free(sp);
                free(out);
            } else {
                FUZZ_CHECK((rc == -EINVAL || rc == -ENOMEM) && out == NULL && sp == NULL && err[0] != '\0');
            }
        }
    }
    free(msgs);
}

static void fuzz_encode(const rt_oai_request *r, const uint8_t *text, size_t len)
{
    rt_oai_usage u = {.prompt_tokens = r->n_prompt_tokens, .completion_tokens = (int)(len & 0xffff)};
    const char *t = (const char *)text;
    /* log-probabilities over the input's bytes: odd text, odd numbers */
    static const float lps[] = {0.0f, -0.5f, -INFINITY, NAN, -1e30f, INFINITY};
    rt_oai_logprob lp[2];
    for (int i = 0; i < 2; i++) {
        size_t half = i ? len - len / 2 : len / 2;
        lp[i].tok = (rt_oai_token_lp){t + (i ? len / 2 : 0), half, lps[(len + (size_t)i) % 6]};
        lp[i].n_top = r->top_logprobs;
        for (int j = 0; j < lp[i].n_top; j++)
            lp[i].top[j] = (rt_oai_token_lp){t, len > (size_t)j ? (size_t)j : len, lps[(size_t)j % 6]};
    }
    const rt_oai_head h = {r->chat, false, r->logprobs, "cmpl-fuzz", r->model, 1700000000};
    char *s = rt_oai_response_json(&h, t, len, "stop", &u, lp, 2);
    fuzz_check_json(s, strlen(s));
    free(s);

    /* first chunk, a middle one, the last, the usage chunk */
    size_t n;
    const char *finish[] = {NULL, NULL, "length", NULL};
    const char *texts[] = {t, t, NULL, NULL};
    const rt_oai_head hs = {r->chat, r->include_usage, r->logprobs, "cmpl-fuzz", r->model, 1};
    for (int i = 0; i < 4; i++) {
        s = rt_oai_chunk_sse(&hs, i == 0, texts[i], texts[i] ? len : 0, finish[i], i == 3 ? &u : NULL, lp, i,
                             &n);
        FUZZ_CHECK(s != NULL && n >= 8 && strlen(s) <= n);
        FUZZ_CHECK(memcmp(s, "data: ", 6) == 0 && memcmp(s + n - 2, "\n\n", 2) == 0);
        fuzz_check_json(s + 6, n - 8);
        free(s);
    }

    s = rt_oai_models_json(r->model, 1);
    fuzz_check_json(s, strlen(s));
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int chat = 0; chat < 2; chat++) {
        rt_oai_request r;
        rt_oai_error e;
        int rc = rt_oai_parse((const char *)data, size, chat, FUZZ_N_VOCAB, &r, &e);
        if (rc < 0) {
            fuzz_check_rejected(&r, &e, rc);
            continue;
        }
        FUZZ_CHECK(rc == 0);
        fuzz_check_accepted(&r, chat);
        if (chat)
            fuzz_render(&r);
        fuzz_encode(&r, data, size);
        rt_oai_request_dispose(&r);
    }
    return 0;
}
