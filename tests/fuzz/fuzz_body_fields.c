/* libFuzzer target for gateway/front/body_fields.c, differential against jansson.
 *
 * Each input is a request body: when jansson (JSON_REJECT_DUPLICATES, as
 * the gateway used it) loads it as an object, the scan must accept it and
 * read the same model (string or not, decoded length, bytes) and token
 * limit (a real with an integral value counting as that integer, as the
 * worker takes it); when jansson refuses it, the scan may answer either way but must
 * give a reason when it refuses. The same bytes are then a response for
 * the usage scan: fed whole, in two pieces cut where the first byte says,
 * and byte by byte, it must read the same completion_tokens each time.
 * Violations are __builtin_trap so the fuzzer keeps them. */
#include "gateway/front/body_fields.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond)                                                                                     \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            __builtin_trap();                                                                                \
    } while (0)

/* What the worker takes for an integer (runtime/openai.c, get_int): an
 * integer, or a real with an integral value. */
static bool integral(json_t *v, long long *out)
{
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    if (!json_is_real(v))
        return false;
    double d = json_real_value(v);
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || d != (double)(long long)d)
        return false;
    *out = (long long)d;
    return true;
}

/* The integers anywhere in v, as prompt_ids counts them in "prompt". */
static long long integers_in(json_t *v)
{
    long long n = json_is_integer(v);
    size_t i;
    const char *k;
    json_t *x;
    if (json_is_array(v))
        json_array_foreach(v, i, x) n += integers_in(x);
    else if (json_is_object(v))
        json_object_foreach(v, k, x) n += integers_in(x);
    return n;
}

static void check_fields(const uint8_t *data, size_t size)
{
    gw_body_fields f;
    char err[128];
    int rc = gw_body_fields_scan(data, size, &f, err, sizeof(err));
    FUZZ_CHECK(rc == 0 || rc == -EINVAL);
    FUZZ_CHECK(memchr(err, '\0', sizeof(err)) != NULL);
    if (rc)
        FUZZ_CHECK(err[0] != '\0');
    else if (f.has_model)
        FUZZ_CHECK(f.model[f.model_len < GW_BODY_MODEL_MAX ? f.model_len : GW_BODY_MODEL_MAX - 1] == '\0');

    json_error_t je;
    json_t *o = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return;
    }
    FUZZ_CHECK(rc == 0);
    json_t *m = json_object_get(o, "model");
    FUZZ_CHECK(f.has_model == json_is_string(m));
    if (json_is_string(m)) {
        FUZZ_CHECK(f.model_len == json_string_length(m));
        if (f.model_len < GW_BODY_MODEL_MAX)
            FUZZ_CHECK(!memcmp(f.model, json_string_value(m), f.model_len + 1));
        else
            FUZZ_CHECK(!memcmp(f.model, json_string_value(m), GW_BODY_MODEL_MAX - 1));
    }
    long long want = -1;
    if (!integral(json_object_get(o, "max_completion_tokens"), &want))
        integral(json_object_get(o, "max_tokens"), &want);
    FUZZ_CHECK(f.max_tokens == want);
    FUZZ_CHECK(f.stream == json_is_true(json_object_get(o, "stream")));
    json_t *pr = json_object_get(o, "prompt");
    FUZZ_CHECK(f.prompt_ids == (json_is_array(pr) || json_is_object(pr) ? integers_in(pr) : 0));
    json_decref(o);
}

static void check_usage(const uint8_t *data, size_t size)
{
    gw_usage_scan whole, two, bytes;
    gw_usage_scan_init(&whole);
    gw_usage_scan_feed(&whole, data, size);
    FUZZ_CHECK(whole.tokens >= -1);

    size_t cut = size ? data[0] % (size + 1) : 0;
    gw_usage_scan_init(&two);
    gw_usage_scan_feed(&two, data, cut);
    gw_usage_scan_feed(&two, data + cut, size - cut);
    FUZZ_CHECK(two.tokens == whole.tokens);

    gw_usage_scan_init(&bytes);
    for (size_t i = 0; i < size; i++)
        gw_usage_scan_feed(&bytes, data + i, 1);
    FUZZ_CHECK(bytes.tokens == whole.tokens);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Exact-size copy: AddressSanitizer then sees any read past the end. */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    check_fields(copy, size);
    check_usage(copy, size);
    free(copy);
    return 0;
}
