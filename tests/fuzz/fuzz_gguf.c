/* libFuzzer target for the GGUF reader: parses the input with
 * rt_gguf_open_mem and, when it parses, walks every key/value pair through
 * every getter and every array element (bounded), and touches the first and
 * last byte of every tensor's data, so that a bad offset the validator let
 * through shows up as an ASan report; then reads the hyper-parameters as the
 * model loader does (every family's keys of runtime/arch.c: experts, windows,
 * RoPE scalings, soft-caps, multipliers). The invariants the reader promises are
 * checked with __builtin_trap so that a violation is a crash the fuzzer
 * keeps.
 *
 * tests/unit/test_gguf_fuzz_replay.c #includes this file to run the same
 * walk over seeds and mutations in the regular test suite, without clang. */
#include "runtime/gguf.h"
#include "runtime/model.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define FUZZ_MAX_ELEMS 4096

#define FUZZ_CHECK(cond)                                                                                     \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            __builtin_trap();                                                                                \
    } while (0)

static volatile uint8_t fuzz_sink;

static void fuzz_touch(rt_gguf_str s)
{
    if (s.n > 0) {
        fuzz_sink ^= (uint8_t)s.p[0];
        fuzz_sink ^= (uint8_t)s.p[s.n - 1];
    }
}

/* Copies a name from the file into a C string when it has no NUL inside. */
static bool fuzz_cstr(rt_gguf_str s, char *buf, size_t cap)
{
    if (s.n >= cap || (s.n > 0 && memchr(s.p, '\0', s.n)))
        return false;
    if (s.n > 0)
        memcpy(buf, s.p, s.n);
    buf[s.n] = '\0';
    return true;
}

static void fuzz_walk_kv(const rt_gguf *g, int64_t i)
{
    char key[512];
    rt_gguf_str name = rt_gguf_key_name(g, i);
    fuzz_touch(name);
    rt_gguf_vtype type = rt_gguf_kv_type(g, i);
    FUZZ_CHECK((uint32_t)type <= RT_GGUF_FLOAT64);
    if (fuzz_cstr(name, key, sizeof(key))) {
        FUZZ_CHECK(rt_gguf_find_key(g, key) == i);
        uint32_t u32;
        uint64_t u64;
        int64_t i64;
        float f;
        bool b;
        rt_gguf_str s;
        int rc = rt_gguf_get_u32(g, key, &u32);
        FUZZ_CHECK(rc == 0 || rc == -EINVAL);
        rc = rt_gguf_get_u64(g, key, &u64);
        FUZZ_CHECK(rc == 0 || rc == -EINVAL);
        rc = rt_gguf_get_i64(g, key, &i64);
        FUZZ_CHECK(rc == 0 || rc == -EINVAL);
        rc = rt_gguf_get_f32(g, key, &f);
        FUZZ_CHECK(rc == 0 || rc == -EINVAL);
        rc = rt_gguf_get_bool(g, key, &b);
        FUZZ_CHECK(rc == 0 || rc == -EINVAL);
        rc = rt_gguf_get_str(g, key, &s);
        FUZZ_CHECK(rc == (type == RT_GGUF_STRING ? 0 : -EINVAL));
        if (rc == 0)
            fuzz_touch(s);
    }
    int64_t v;
    double d;
    rt_gguf_str s;
    (void)rt_gguf_kv_i64(g, i, &v);
    (void)rt_gguf_kv_f64(g, i, &d);
    if (rt_gguf_kv_str(g, i, &s) == 0)
        fuzz_touch(s);
    if (type != RT_GGUF_ARRAY) {
        FUZZ_CHECK(rt_gguf_arr_n(g, i) == 0);
        return;
    }
    uint64_t n = rt_gguf_arr_n(g, i);
    rt_gguf_vtype et = rt_gguf_arr_type(g, i);
    FUZZ_CHECK((uint32_t)et <= RT_GGUF_FLOAT64);
    uint64_t lim = n < FUZZ_MAX_ELEMS ? n : FUZZ_MAX_ELEMS;
    for (uint64_t j = 0; j < lim; j++) {
        int rs = rt_gguf_arr_str(g, i, j, &s);
        int ri = rt_gguf_arr_i64(g, i, j, &v);
        int rf = rt_gguf_arr_f64(g, i, j, &d);
        FUZZ_CHECK((rs == 0) == (et == RT_GGUF_STRING));
        FUZZ_CHECK(rf == 0 || et == RT_GGUF_STRING || et == RT_GGUF_ARRAY);
        FUZZ_CHECK(ri == 0 || ri == -EINVAL);
        if (rs == 0)
            fuzz_touch(s);
    }
    /* the last element, and one past it */
    if (n > 0 && rt_gguf_arr_str(g, i, n - 1, &s) == 0)
        fuzz_touch(s);
    (void)rt_gguf_arr_f64(g, i, n - 1, &d);
    FUZZ_CHECK(rt_gguf_arr_str(g, i, n, &s) == -EINVAL);
    FUZZ_CHECK(rt_gguf_arr_i64(g, i, n, &v) == -EINVAL);
    FUZZ_CHECK(rt_gguf_arr_f64(g, i, n, &d) == -EINVAL);
}

static void fuzz_walk_tensor(const rt_gguf *g, const uint8_t *data, size_t size, int64_t i)
{
    char name[512];
    const rt_gguf_tensor *t = rt_gguf_tensor_at(g, i);
    FUZZ_CHECK(t != NULL);
    fuzz_touch(t->name);
    FUZZ_CHECK(t->n_dims >= 1 && t->n_dims <= RT_GGUF_MAX_DIMS);
    for (int j = 0; j < RT_GGUF_MAX_DIMS; j++)
        FUZZ_CHECK(t->ne[j] >= 0);
    FUZZ_CHECK(t->offset % rt_gguf_alignment(g) == 0);
    const uint8_t *p = t->data;
    FUZZ_CHECK(p >= data && (size_t)(p - data) <= size && t->nbytes <= size - (size_t)(p - data));
    if (t->nbytes > 0) {
        fuzz_sink ^= p[0];
        fuzz_sink ^= p[t->nbytes - 1];
    }
    if (fuzz_cstr(t->name, name, sizeof(name)))
        FUZZ_CHECK(rt_gguf_find_tensor(g, name) == t);
}

/* The loader accepts the hyper-parameters with the bounds the forward pass
 * relies on, or says why not. */
static void fuzz_hparams(const rt_gguf *g)
{
    rt_hparams hp;
    char err[256];
    err[0] = '\0';
    int rc = rt_hparams_from_gguf(g, &hp, err, sizeof(err));
    if (rc < 0) {
        FUZZ_CHECK(rc == -EINVAL && err[0] != '\0' && memchr(err, '\0', sizeof(err)) != NULL);
        return;
    }
    FUZZ_CHECK(rc == 0 && hp.n_layer > 0 && hp.n_embd > 0 && hp.n_vocab > 0 && hp.n_ctx_train > 0);
    FUZZ_CHECK(hp.n_head > 0 && hp.n_head_kv > 0 && hp.n_head % hp.n_head_kv == 0);
    FUZZ_CHECK(hp.head_dim > 0 && hp.head_dim % 2 == 0 && hp.n_rot > 0 && hp.n_rot <= hp.head_dim);
    FUZZ_CHECK(hp.n_ff > 0 || hp.n_expert > 0);
    FUZZ_CHECK(hp.n_expert == 0 || (hp.n_expert_used >= 1 && hp.n_expert_used <= hp.n_expert && hp.n_ff_exp > 0));
    FUZZ_CHECK(hp.n_swa >= 0 && hp.n_ctx_orig > 0 && hp.rope_scale > 0.0f && hp.rope_freq_base > 0.0f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rt_gguf *g = NULL;
    char err[256];
    err[0] = '\0';
    int rc = rt_gguf_open_mem(data, size, &g, err, sizeof(err));
    if (rc < 0) {
        /* every rejection explains itself */
        FUZZ_CHECK(rc == -EINVAL || rc == -ENOMEM);
        FUZZ_CHECK(g == NULL && err[0] != '\0' && memchr(err, '\0', sizeof(err)) != NULL);
        return 0;
    }
    FUZZ_CHECK(rt_gguf_version(g) == 2 || rt_gguf_version(g) == 3);
    uint32_t a = rt_gguf_alignment(g);
    FUZZ_CHECK(a != 0 && (a & (a - 1)) == 0);
    FUZZ_CHECK(rt_gguf_file_size(g) == size && rt_gguf_data_offset(g) % a == 0);
    for (int64_t i = 0; i < rt_gguf_n_kv(g); i++)
        fuzz_walk_kv(g, i);
    FUZZ_CHECK(rt_gguf_kv_type(g, rt_gguf_n_kv(g)) > RT_GGUF_FLOAT64);
    for (int64_t i = 0; i < rt_gguf_n_tensors(g); i++)
        fuzz_walk_tensor(g, data, size, i);
    FUZZ_CHECK(rt_gguf_tensor_at(g, rt_gguf_n_tensors(g)) == NULL);
    fuzz_hparams(g);
    rt_gguf_free(g);
    return 0;
}
