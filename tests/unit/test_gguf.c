/* Tests of the GGUF reader and writer: round trips of every value type,
 * arrays and tensor types through the writer and the reader (in memory and
 * through a real file, alignments 32 and 64, v2 and v3 headers), then a table
 * of hand-built bad files in the spirit of llama.cpp's tests/test-gguf.cpp.
 * Every bad file must be rejected with -EINVAL and a message naming the
 * field, and every prefix of a valid file must fail cleanly. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kernels/kn.h"
#include "runtime/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rng(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* Parses a copy of exactly len bytes so that ASan sees any over-read. On
 * success *keep is the copy, which the caller frees after rt_gguf_free. */
static int open_copy(const void *p, size_t len, rt_gguf **g, void **keep, char *err, size_t err_len)
{
    void *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    memcpy(copy, p, len);
    err[0] = '\0';
    *keep = NULL;
    int rc = rt_gguf_open_mem(copy, len, g, err, err_len);
    if (rc == 0)
        *keep = copy;
    else
        free(copy);
    return rc;
}

static void *written(rt_gguf_writer *w, size_t *len)
{
    void *buf;
    char err[256];
    assert_int_equal(rt_gguf_writer_write_mem(w, &buf, len, err, sizeof(err)), 0);
    return buf;
}

static int64_t key(const rt_gguf *g, const char *k)
{
    int64_t i = rt_gguf_find_key(g, k);
    assert_true(i >= 0);
    return i;
}

/* ---- round trips ---- */

static void test_scalars(void **state)
{
    (void)state;
    rt_gguf_writer *w = rt_gguf_writer_new();
    assert_non_null(w);
    uint8_t u8 = 200;
    int8_t i8 = -100;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    int64_t i64 = -5000000000LL;
    double f64 = 2.5e300;
    assert_int_equal(rt_gguf_writer_add_scalar(w, "t.u8", RT_GGUF_UINT8, &u8), 0);
    assert_int_equal(rt_gguf_writer_add_scalar(w, "t.i8", RT_GGUF_INT8, &i8), 0);
    assert_int_equal(rt_gguf_writer_add_scalar(w, "t.u16", RT_GGUF_UINT16, &u16), 0);
    assert_int_equal(rt_gguf_writer_add_scalar(w, "t.i16", RT_GGUF_INT16, &i16), 0);
    assert_int_equal(rt_gguf_writer_add_u32(w, "t.u32", 4000000000u), 0);
    assert_int_equal(rt_gguf_writer_add_i32(w, "t.i32", -2000000000), 0);
    assert_int_equal(rt_gguf_writer_add_f32(w, "t.f32", 1.5f), 0);
    assert_int_equal(rt_gguf_writer_add_f32(w, "t.inf", -INFINITY), 0);
    assert_int_equal(rt_gguf_writer_add_bool(w, "t.bool", true), 0);
    assert_int_equal(rt_gguf_writer_add_str(w, "t.str", "héllo wörld"), 0);
    assert_int_equal(rt_gguf_writer_add_str(w, "t.empty", ""), 0);
    assert_int_equal(rt_gguf_writer_add_u64(w, "t.u64", UINT64_MAX), 0);
    assert_int_equal(rt_gguf_writer_add_scalar(w, "t.i64", RT_GGUF_INT64, &i64), 0);
    assert_int_equal(rt_gguf_writer_add_scalar(w, "t.f64", RT_GGUF_FLOAT64, &f64), 0);
    assert_int_equal(rt_gguf_writer_add_u32(w, "t.replaced", 1), 0);
    assert_int_equal(rt_gguf_writer_add_u32(w, "t.replaced", 2), 0); /* replaces, no duplicate */
    /* strings and arrays are not scalars */
    assert_int_equal(rt_gguf_writer_add_scalar(w, "t.bad", RT_GGUF_STRING, "x"), -EINVAL);
    assert_int_equal(rt_gguf_writer_add_scalar(w, "t.bad", (rt_gguf_vtype)99, &u8), -EINVAL);

    size_t len;
    void *buf = written(w, &len);
    rt_gguf_writer_free(w);
    rt_gguf *g;
    char err[256];
    void *keep;
    assert_int_equal(open_copy(buf, len, &g, &keep, err, sizeof(err)), 0);
    free(buf);

    assert_int_equal(rt_gguf_version(g), 3);
    assert_int_equal(rt_gguf_alignment(g), 32);
    assert_int_equal(rt_gguf_n_kv(g), 15);
    assert_int_equal(rt_gguf_n_tensors(g), 0);
    static const struct {
        const char *key;
        rt_gguf_vtype type;
    } types[] = {
        {"t.u8", RT_GGUF_UINT8},    {"t.i8", RT_GGUF_INT8},    {"t.u16", RT_GGUF_UINT16},
        {"t.i16", RT_GGUF_INT16},   {"t.u32", RT_GGUF_UINT32}, {"t.i32", RT_GGUF_INT32},
        {"t.f32", RT_GGUF_FLOAT32}, {"t.bool", RT_GGUF_BOOL},  {"t.str", RT_GGUF_STRING},
        {"t.u64", RT_GGUF_UINT64},  {"t.i64", RT_GGUF_INT64},  {"t.f64", RT_GGUF_FLOAT64},
    };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        rt_gguf_vtype got = rt_gguf_kv_type(g, key(g, types[i].key));
        if (got != types[i].type)
            fail_msg("%s: type %d, want %d", types[i].key, (int)got, (int)types[i].type);
    }
    assert_true(rt_gguf_str_eq(rt_gguf_key_name(g, key(g, "t.u16")), "t.u16"));

    int64_t v;
    assert_int_equal(rt_gguf_kv_i64(g, key(g, "t.u8"), &v), 0);
    assert_int_equal(v, 200);
    assert_int_equal(rt_gguf_kv_i64(g, key(g, "t.i8"), &v), 0);
    assert_int_equal(v, -100);
    assert_int_equal(rt_gguf_kv_i64(g, key(g, "t.u16"), &v), 0);
    assert_int_equal(v, 60000);
    assert_int_equal(rt_gguf_kv_i64(g, key(g, "t.i16"), &v), 0);
    assert_int_equal(v, -30000);
    assert_int_equal(rt_gguf_kv_i64(g, key(g, "t.i32"), &v), 0);
    assert_int_equal(v, -2000000000);
    assert_int_equal(rt_gguf_kv_i64(g, key(g, "t.i64"), &v), 0);
    assert_true(v == -5000000000LL);
    assert_int_equal(rt_gguf_kv_i64(g, key(g, "t.bool"), &v), 0);
    assert_int_equal(v, 1);
    assert_int_equal(rt_gguf_kv_i64(g, key(g, "t.f32"), &v), -EINVAL); /* 1.5 is not an integer */
    assert_int_equal(rt_gguf_kv_i64(g, key(g, "t.u64"), &v), -EINVAL); /* does not fit */
    assert_int_equal(rt_gguf_kv_i64(g, key(g, "t.str"), &v), -EINVAL);
    assert_int_equal(rt_gguf_kv_i64(g, key(g, "t.replaced"), &v), 0);
    assert_int_equal(v, 2);

    double d;
    assert_int_equal(rt_gguf_kv_f64(g, key(g, "t.f32"), &d), 0);
    assert_true(d == 1.5);
    assert_int_equal(rt_gguf_kv_f64(g, key(g, "t.f64"), &d), 0);
    assert_true(d == 2.5e300);
    assert_int_equal(rt_gguf_kv_f64(g, key(g, "t.i16"), &d), 0);
    assert_true(d == -30000.0);
    assert_int_equal(rt_gguf_kv_f64(g, key(g, "t.str"), &d), -EINVAL);

    uint32_t u32;
    uint64_t u64;
    int64_t s64;
    float f;
    bool b;
    rt_gguf_str s;
    assert_int_equal(rt_gguf_get_u32(g, "t.u32", &u32), 0);
    assert_int_equal(u32, 4000000000u);
    assert_int_equal(rt_gguf_get_u32(g, "t.u8", &u32), 0); /* widening */
    assert_int_equal(u32, 200);
    assert_int_equal(rt_gguf_get_u32(g, "t.i32", &u32), -EINVAL); /* negative */
    assert_int_equal(rt_gguf_get_u32(g, "t.u64", &u32), -EINVAL); /* too big */
    assert_int_equal(rt_gguf_get_u32(g, "t.f32", &u32), -EINVAL);
    assert_int_equal(rt_gguf_get_u32(g, "t.bool", &u32), -EINVAL);
    assert_int_equal(rt_gguf_get_u32(g, "t.missing", &u32), -ENOENT);
    assert_int_equal(rt_gguf_get_u64(g, "t.u64", &u64), 0);
    assert_true(u64 == UINT64_MAX);
    assert_int_equal(rt_gguf_get_u64(g, "t.i16", &u64), -EINVAL);
    assert_int_equal(rt_gguf_get_u64(g, "t.missing", &u64), -ENOENT);
    assert_int_equal(rt_gguf_get_i64(g, "t.i64", &s64), 0);
    assert_true(s64 == -5000000000LL);
    assert_int_equal(rt_gguf_get_i64(g, "t.u32", &s64), 0);
    assert_true(s64 == 4000000000LL);
    assert_int_equal(rt_gguf_get_i64(g, "t.u64", &s64), -EINVAL);
    assert_int_equal(rt_gguf_get_i64(g, "t.str", &s64), -EINVAL);
    assert_int_equal(rt_gguf_get_f32(g, "t.f32", &f), 0);
    assert_true(f == 1.5f);
    assert_int_equal(rt_gguf_get_f32(g, "t.i32", &f), 0); /* integers convert */
    assert_true(f == -2000000000.0f);
    assert_int_equal(rt_gguf_get_f32(g, "t.f64", &f), -EINVAL); /* out of float range */
    assert_int_equal(rt_gguf_get_f32(g, "t.inf", &f), 0);       /* but infinity converts */
    assert_true(isinf(f) && f < 0);
    assert_int_equal(rt_gguf_get_f32(g, "t.str", &f), -EINVAL);
    assert_int_equal(rt_gguf_get_f32(g, "t.missing", &f), -ENOENT);
    assert_int_equal(rt_gguf_get_bool(g, "t.bool", &b), 0);
    assert_true(b);
    assert_int_equal(rt_gguf_get_bool(g, "t.u8", &b), -EINVAL);
    assert_int_equal(rt_gguf_get_bool(g, "t.missing", &b), -ENOENT);
    assert_int_equal(rt_gguf_get_str(g, "t.str", &s), 0);
    assert_true(rt_gguf_str_eq(s, "héllo wörld"));
    assert_int_equal(rt_gguf_get_str(g, "t.empty", &s), 0);
    assert_int_equal(s.n, 0);
    assert_int_equal(rt_gguf_get_str(g, "t.u8", &s), -EINVAL);
    assert_int_equal(rt_gguf_get_str(g, "t.missing", &s), -ENOENT);

    /* index accessors outside the table */
    assert_int_equal(rt_gguf_find_key(g, "t"), -1);
    assert_null(rt_gguf_key_name(g, -1).p);
    assert_null(rt_gguf_key_name(g, 15).p);
    assert_true(rt_gguf_kv_type(g, 15) > RT_GGUF_FLOAT64);
    assert_int_equal(rt_gguf_kv_i64(g, 99, &v), -EINVAL);
    assert_int_equal(rt_gguf_kv_str(g, -1, &s), -EINVAL);
    assert_int_equal(rt_gguf_arr_n(g, key(g, "t.u8")), 0);
    assert_true(rt_gguf_arr_type(g, key(g, "t.u8")) > RT_GGUF_FLOAT64);
    assert_null(rt_gguf_tensor_at(g, 0));
    assert_null(rt_gguf_find_tensor(g, "x"));

    rt_gguf_free(g);
    free(keep);
}

static void test_arrays(void **state)
{
    (void)state;
    rt_gguf_writer *w = rt_gguf_writer_new();
    const uint8_t a_u8[] = {0, 1, 255};
    const int8_t a_i8[] = {-128, 0, 127};
    const uint16_t a_u16[] = {0, 65535};
    const int16_t a_i16[] = {-32768, 32767};
    const uint32_t a_u32[] = {0, 4294967295u};
    const int32_t a_i32[] = {INT32_MIN, -1, INT32_MAX};
    const float a_f32[] = {0.25f, -1e30f, 3.0f};
    const bool a_bool[] = {true, false, true};
    const uint64_t a_u64[] = {UINT64_MAX, 7};
    const int64_t a_i64[] = {INT64_MIN, INT64_MAX};
    const double a_f64[] = {1e-300, -2.0};
    const char *const a_str[] = {"<s>", "", "▁the", "a\nb"};
    assert_int_equal(rt_gguf_writer_add_arr(w, "a.u8", RT_GGUF_UINT8, a_u8, 3), 0);
    assert_int_equal(rt_gguf_writer_add_arr(w, "a.i8", RT_GGUF_INT8, a_i8, 3), 0);
    assert_int_equal(rt_gguf_writer_add_arr(w, "a.u16", RT_GGUF_UINT16, a_u16, 2), 0);
    assert_int_equal(rt_gguf_writer_add_arr(w, "a.i16", RT_GGUF_INT16, a_i16, 2), 0);
    assert_int_equal(rt_gguf_writer_add_arr(w, "a.u32", RT_GGUF_UINT32, a_u32, 2), 0);
    assert_int_equal(rt_gguf_writer_add_arr_i32(w, "a.i32", a_i32, 3), 0);
    assert_int_equal(rt_gguf_writer_add_arr_f32(w, "a.f32", a_f32, 3), 0);
    assert_int_equal(rt_gguf_writer_add_arr(w, "a.bool", RT_GGUF_BOOL, a_bool, 3), 0);
    assert_int_equal(rt_gguf_writer_add_arr(w, "a.u64", RT_GGUF_UINT64, a_u64, 2), 0);
    assert_int_equal(rt_gguf_writer_add_arr(w, "a.i64", RT_GGUF_INT64, a_i64, 2), 0);
    assert_int_equal(rt_gguf_writer_add_arr(w, "a.f64", RT_GGUF_FLOAT64, a_f64, 2), 0);
    assert_int_equal(rt_gguf_writer_add_arr_str(w, "a.str", a_str, 4), 0);
    assert_int_equal(rt_gguf_writer_add_arr_f32(w, "a.empty", NULL, 0), 0);
    assert_int_equal(rt_gguf_writer_add_arr(w, "a.bad", RT_GGUF_STRING, a_str, 1), -EINVAL);
    size_t len;
    void *buf = written(w, &len);
    rt_gguf_writer_free(w);
    rt_gguf *g;
    char err[256];
    assert_int_equal(rt_gguf_open_mem(buf, len, &g, err, sizeof(err)), 0);

    struct {
        const char *key;
        rt_gguf_vtype type;
        uint64_t n;
    } shape[] = {
        {"a.u8", RT_GGUF_UINT8, 3},      {"a.i8", RT_GGUF_INT8, 3},     {"a.u16", RT_GGUF_UINT16, 2},
        {"a.i16", RT_GGUF_INT16, 2},     {"a.u32", RT_GGUF_UINT32, 2},  {"a.i32", RT_GGUF_INT32, 3},
        {"a.f32", RT_GGUF_FLOAT32, 3},   {"a.bool", RT_GGUF_BOOL, 3},   {"a.u64", RT_GGUF_UINT64, 2},
        {"a.i64", RT_GGUF_INT64, 2},     {"a.f64", RT_GGUF_FLOAT64, 2}, {"a.str", RT_GGUF_STRING, 4},
        {"a.empty", RT_GGUF_FLOAT32, 0},
    };
    for (size_t k = 0; k < sizeof(shape) / sizeof(shape[0]); k++) {
        int64_t i = key(g, shape[k].key);
        assert_int_equal(rt_gguf_kv_type(g, i), RT_GGUF_ARRAY);
        assert_int_equal(rt_gguf_arr_type(g, i), shape[k].type);
        assert_int_equal(rt_gguf_arr_n(g, i), shape[k].n);
        int64_t v;
        double d;
        rt_gguf_str s;
        /* one past the end, and scalar getters on an array */
        assert_int_equal(rt_gguf_arr_i64(g, i, shape[k].n, &v), -EINVAL);
        assert_int_equal(rt_gguf_arr_f64(g, i, shape[k].n, &d), -EINVAL);
        assert_int_equal(rt_gguf_arr_str(g, i, shape[k].n, &s), -EINVAL);
        assert_int_equal(rt_gguf_arr_str(g, i, UINT64_MAX, &s), -EINVAL);
        assert_int_equal(rt_gguf_kv_i64(g, i, &v), -EINVAL);
        assert_int_equal(rt_gguf_kv_str(g, i, &s), -EINVAL);
    }
    int64_t v;
    double d;
    rt_gguf_str s;
#define I64_AT(k, j, want)                                                                                   \
    do {                                                                                                     \
        assert_int_equal(rt_gguf_arr_i64(g, key(g, k), j, &v), 0);                                           \
        assert_true(v == (int64_t)(want));                                                                   \
    } while (0)
    for (int j = 0; j < 3; j++) {
        I64_AT("a.u8", j, a_u8[j]);
        I64_AT("a.i8", j, a_i8[j]);
        I64_AT("a.i32", j, a_i32[j]);
        I64_AT("a.bool", j, a_bool[j]);
        assert_int_equal(rt_gguf_arr_f64(g, key(g, "a.f32"), j, &d), 0);
        assert_true(d == (double)a_f32[j]);
    }
    for (int j = 0; j < 2; j++) {
        I64_AT("a.u16", j, a_u16[j]);
        I64_AT("a.i16", j, a_i16[j]);
        I64_AT("a.u32", j, a_u32[j]);
        I64_AT("a.i64", j, a_i64[j]);
        assert_int_equal(rt_gguf_arr_f64(g, key(g, "a.f64"), j, &d), 0);
        assert_true(d == a_f64[j]);
    }
#undef I64_AT
    assert_int_equal(rt_gguf_arr_i64(g, key(g, "a.u64"), 0, &v), -EINVAL); /* UINT64_MAX does not fit */
    assert_int_equal(rt_gguf_arr_i64(g, key(g, "a.u64"), 1, &v), 0);
    assert_int_equal(v, 7);
    assert_int_equal(rt_gguf_arr_f64(g, key(g, "a.u64"), 0, &d), 0);
    assert_true(d == (double)UINT64_MAX);
    assert_int_equal(rt_gguf_arr_i64(g, key(g, "a.f32"), 2, &v), 0); /* 3.0 is integral */
    assert_int_equal(v, 3);
    assert_int_equal(rt_gguf_arr_i64(g, key(g, "a.f32"), 1, &v), -EINVAL); /* -1e30 is out of range */
    for (uint64_t j = 0; j < 4; j++) {
        assert_int_equal(rt_gguf_arr_str(g, key(g, "a.str"), j, &s), 0);
        assert_true(rt_gguf_str_eq(s, a_str[j]));
    }
    assert_int_equal(rt_gguf_arr_i64(g, key(g, "a.str"), 0, &v), -EINVAL);
    assert_int_equal(rt_gguf_arr_str(g, key(g, "a.u8"), 0, &s), -EINVAL);
    rt_gguf_free(g);
    free(buf);
}

typedef struct tspec {
    const char *name;
    kn_type type;
    uint32_t n_dims;
    int64_t ne[4];
} tspec;

static const tspec tensors[] = {
    {"tok_embd.weight", KN_TYPE_F32, 2, {8, 3}},       {"blk.0.attn_norm.weight", KN_TYPE_F16, 1, {5}},
    {"blk.0.attn_q.weight", KN_TYPE_Q8_0, 2, {64, 2}}, {"blk.0.ffn_up.weight", KN_TYPE_Q4_0, 3, {32, 3, 2}},
    {"blk.0.empty", KN_TYPE_F32, 4, {4, 0, 2, 1}},     {"output.weight", KN_TYPE_Q4_0, 4, {64, 1, 1, 2}},
};
#define N_TENSORS (sizeof(tensors) / sizeof(tensors[0]))

static uint64_t tensor_bytes(const tspec *t)
{
    uint64_t n = 1;
    for (uint32_t j = 0; j < t->n_dims; j++)
        n *= (uint64_t)t->ne[j];
    return n / (uint64_t)kn_type_block_elems(t->type) * kn_type_block_bytes(t->type);
}

/* Adds the tensors above with pseudo-random bytes; data[i] is freed by the
 * caller. */
static void add_tensors(rt_gguf_writer *w, uint8_t **data)
{
    for (size_t i = 0; i < N_TENSORS; i++) {
        uint64_t nb = tensor_bytes(&tensors[i]);
        data[i] = malloc(nb ? nb : 1);
        for (uint64_t k = 0; k < nb; k++)
            data[i][k] = (uint8_t)rng();
        assert_int_equal(rt_gguf_writer_add_tensor(w, tensors[i].name, tensors[i].type, tensors[i].n_dims,
                                                   tensors[i].ne, data[i], nb),
                         0);
    }
}

static void check_tensors(const rt_gguf *g, uint8_t **data, uint32_t align, bool mapped)
{
    assert_int_equal(rt_gguf_n_tensors(g), N_TENSORS);
    assert_int_equal(rt_gguf_data_offset(g) % align, 0);
    for (size_t i = 0; i < N_TENSORS; i++) {
        const rt_gguf_tensor *t = rt_gguf_find_tensor(g, tensors[i].name);
        assert_non_null(t);
        assert_ptr_equal(t, rt_gguf_tensor_at(g, (int64_t)i));
        assert_true(rt_gguf_str_eq(t->name, tensors[i].name));
        assert_int_equal(t->type, tensors[i].type);
        assert_int_equal(t->n_dims, tensors[i].n_dims);
        for (uint32_t j = 0; j < 4; j++)
            assert_int_equal(t->ne[j], j < tensors[i].n_dims ? tensors[i].ne[j] : 1);
        assert_int_equal(t->nbytes, tensor_bytes(&tensors[i]));
        assert_int_equal(t->offset % align, 0);
        if (mapped)
            assert_int_equal((uintptr_t)t->data % align, 0);
        if (t->nbytes)
            assert_memory_equal(t->data, data[i], t->nbytes);
    }
    assert_null(rt_gguf_find_tensor(g, "blk.0"));
    assert_null(rt_gguf_find_tensor(g, "output.weightx"));
    assert_null(rt_gguf_tensor_at(g, N_TENSORS));
    assert_null(rt_gguf_tensor_at(g, -1));
}

static char tmpdir[64];

static int setup_tmpdir(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_gguf.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_tmpdir(void **state)
{
    (void)state;
    return rmdir(tmpdir);
}

static void roundtrip_file(uint32_t align)
{
    char path[128], err[512];
    snprintf(path, sizeof(path), "%s/model.gguf", tmpdir);
    rt_gguf_writer *w = rt_gguf_writer_new();
    uint8_t *data[N_TENSORS];
    if (align != RT_GGUF_DEFAULT_ALIGNMENT)
        assert_int_equal(rt_gguf_writer_add_u32(w, "general.alignment", align), 0);
    assert_int_equal(rt_gguf_writer_add_str(w, "general.architecture", "llama"), 0);
    add_tensors(w, data);
    /* invalid tensors are refused at add time */
    int64_t ne[2] = {33, 1};
    assert_int_equal(rt_gguf_writer_add_tensor(w, "bad", KN_TYPE_Q8_0, 2, ne, data[0], 34), -EINVAL);
    ne[0] = 8;
    assert_int_equal(rt_gguf_writer_add_tensor(w, "bad", KN_TYPE_F32, 2, ne, data[0], 31), -EINVAL);
    assert_int_equal(rt_gguf_writer_add_tensor(w, "bad", 99, 2, ne, data[0], 32), -EINVAL);
    assert_int_equal(rt_gguf_writer_add_tensor(w, "bad", KN_TYPE_F32, 5, ne, data[0], 32), -EINVAL);
    assert_int_equal(rt_gguf_writer_add_tensor(w, tensors[0].name, KN_TYPE_F32, 2, ne, data[0], 32), -EINVAL);
    assert_int_equal(rt_gguf_writer_write(w, path, err, sizeof(err)), 0);
    rt_gguf_writer_free(w);

    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);
    rt_gguf *g;
    assert_int_equal(rt_gguf_open(path, &g, err, sizeof(err)), 0);
    assert_int_equal(rt_gguf_alignment(g), align);
    assert_int_equal(rt_gguf_file_size(g), (uint64_t)st.st_size);
    rt_gguf_str s;
    assert_int_equal(rt_gguf_get_str(g, "general.architecture", &s), 0);
    assert_true(rt_gguf_str_eq(s, "llama"));
    check_tensors(g, data, align, true);
    rt_gguf_free(g);

    /* the same bytes through rt_gguf_open_mem */
    void *buf;
    size_t len;
    w = rt_gguf_writer_new();
    if (align != RT_GGUF_DEFAULT_ALIGNMENT)
        assert_int_equal(rt_gguf_writer_add_u32(w, "general.alignment", align), 0);
    for (size_t i = 0; i < N_TENSORS; i++)
        assert_int_equal(rt_gguf_writer_add_tensor(w, tensors[i].name, tensors[i].type, tensors[i].n_dims,
                                                   tensors[i].ne, data[i], tensor_bytes(&tensors[i])),
                         0);
    assert_int_equal(rt_gguf_writer_write_mem(w, &buf, &len, err, sizeof(err)), 0);
    rt_gguf_writer_free(w);
    assert_int_equal(rt_gguf_open_mem(buf, len, &g, err, sizeof(err)), 0);
    check_tensors(g, data, align, false);
    rt_gguf_free(g);
    free(buf);

    for (size_t i = 0; i < N_TENSORS; i++)
        free(data[i]);
    assert_int_equal(unlink(path), 0);
}

static void test_tensors_align32(void **state)
{
    (void)state;
    roundtrip_file(32);
}

static void test_tensors_align64(void **state)
{
    (void)state;
    roundtrip_file(64);
}

/* Hundreds of tensors, as in a real model, all found by name. */
static void test_many_tensors(void **state)
{
    (void)state;
    rt_gguf_writer *w = rt_gguf_writer_new();
    float x[4] = {1, 2, 3, 4};
    int64_t ne[1] = {4};
    char name[64];
    for (int i = 0; i < 400; i++) {
        snprintf(name, sizeof(name), "blk.%d.w%d", i / 9, i % 9);
        assert_int_equal(rt_gguf_writer_add_tensor(w, name, KN_TYPE_F32, 1, ne, x, sizeof(x)), 0);
    }
    size_t len;
    void *buf = written(w, &len);
    rt_gguf_writer_free(w);
    rt_gguf *g;
    char err[256];
    assert_int_equal(rt_gguf_open_mem(buf, len, &g, err, sizeof(err)), 0);
    for (int i = 0; i < 400; i++) {
        snprintf(name, sizeof(name), "blk.%d.w%d", i / 9, i % 9);
        const rt_gguf_tensor *t = rt_gguf_find_tensor(g, name);
        assert_ptr_equal(t, rt_gguf_tensor_at(g, i));
        assert_memory_equal(t->data, x, sizeof(x));
    }
    rt_gguf_free(g);
    free(buf);
}

static void test_v2(void **state)
{
    (void)state;
    rt_gguf_writer *w = rt_gguf_writer_new();
    uint8_t *data[N_TENSORS];
    assert_int_equal(rt_gguf_writer_add_str(w, "general.name", "v2"), 0);
    add_tensors(w, data);
    size_t len;
    uint8_t *buf = written(w, &len);
    rt_gguf_writer_free(w);
    buf[4] = 2; /* v2 and v3 share the layout */
    rt_gguf *g;
    char err[256];
    assert_int_equal(rt_gguf_open_mem(buf, len, &g, err, sizeof(err)), 0);
    assert_int_equal(rt_gguf_version(g), 2);
    check_tensors(g, data, 32, false);
    rt_gguf_free(g);
    free(buf);
    for (size_t i = 0; i < N_TENSORS; i++)
        free(data[i]);
}

static void test_writer_errors(void **state)
{
    (void)state;
    char err[512];
    rt_gguf_writer *w = rt_gguf_writer_new();
    assert_int_equal(rt_gguf_writer_write(w, "/nonexistent-dir/x.gguf", err, sizeof(err)), -ENOENT);
    assert_non_null(strstr(err, "/nonexistent-dir/x.gguf"));
    assert_int_equal(rt_gguf_writer_add_u32(w, "general.alignment", 48), 0);
    void *buf;
    size_t len;
    assert_int_equal(rt_gguf_writer_write_mem(w, &buf, &len, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "alignment"));
    assert_int_equal(rt_gguf_writer_add_u64(w, "general.alignment", 64), 0);
    assert_int_equal(rt_gguf_writer_write_mem(w, &buf, &len, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "u32"));
    char path[128];
    snprintf(path, sizeof(path), "%s/bad.gguf", tmpdir);
    assert_int_equal(rt_gguf_writer_write(w, path, err, sizeof(err)), -EINVAL);
    assert_int_equal(access(path, F_OK), -1); /* nothing left behind */
    rt_gguf_writer_free(w);
    rt_gguf_writer_free(NULL);
}

static void test_open_errors(void **state)
{
    (void)state;
    char err[512];
    rt_gguf *g = (rt_gguf *)1;
    assert_int_equal(rt_gguf_open("/nonexistent-dir/x.gguf", &g, err, sizeof(err)), -ENOENT);
    assert_null(g);
    assert_non_null(strstr(err, "/nonexistent-dir/x.gguf"));
    assert_int_equal(rt_gguf_open(tmpdir, &g, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "regular file"));

    char path[128];
    snprintf(path, sizeof(path), "%s/short.gguf", tmpdir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs("GGUF", f);
    fclose(f);
    assert_int_equal(rt_gguf_open(path, &g, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "too short"));
    /* a bad file through the path names the path, the field and the offset */
    f = fopen(path, "wb");
    const uint8_t hdr[24] = {'G', 'G', 'U', 'F', 1};
    fwrite(hdr, 1, sizeof(hdr), f);
    fclose(f);
    assert_int_equal(rt_gguf_open(path, &g, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "version at offset 4"));
    assert_int_equal(unlink(path), 0);
    /* a NULL or tiny err buffer is fine */
    assert_int_equal(rt_gguf_open_mem(hdr, sizeof(hdr), &g, NULL, 0), -EINVAL);
    assert_int_equal(rt_gguf_open_mem(hdr, sizeof(hdr), &g, err, 1), -EINVAL);
    assert_int_equal(err[0], '\0');
    assert_int_equal(rt_gguf_open_mem(NULL, 0, &g, err, sizeof(err)), -EINVAL);
}

/* ---- hand-built files ---- */

typedef struct bb {
    uint8_t p[4096];
    size_t n;
} bb;

static void put(bb *b, const void *src, size_t n)
{
    assert_true(b->n + n <= sizeof(b->p));
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void u32(bb *b, uint32_t v)
{
    uint8_t t[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, t, 4);
}

static void u64(bb *b, uint64_t v)
{
    u32(b, (uint32_t)v);
    u32(b, (uint32_t)(v >> 32));
}

static void str(bb *b, const char *s)
{
    u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void header(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    put(b, "GGUF", 4);
    u32(b, version);
    u64(b, n_tensors);
    u64(b, n_kv);
}

static void kv_u32(bb *b, const char *k, uint32_t v)
{
    str(b, k);
    u32(b, RT_GGUF_UINT32);
    u32(b, v);
}

static void tinfo(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off)
{
    str(b, name);
    u32(b, n_dims);
    for (uint32_t j = 0; j < n_dims; j++)
        u64(b, ne[j]);
    u32(b, type);
    u64(b, off);
}

/* Pads to the alignment and appends n data bytes. */
static void data(bb *b, uint32_t align, size_t n)
{
    while (b->n % align)
        b->p[b->n++] = 0;
    for (size_t k = 0; k < n; k++)
        b->p[b->n++] = (uint8_t)k;
}

/* A valid file with one kv and one f32 tensor of shape ne; the parameters are
 * what a case corrupts. */
static void one_tensor(bb *b, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off, size_t nbytes)
{
    header(b, 3, 1, 1);
    kv_u32(b, "general.quantization_version", 2);
    tinfo(b, "blk.0.attn_q.weight", n_dims, ne, type, off);
    data(b, 32, nbytes);
}

static const uint64_t ne_8x2[2] = {8, 2};

#define CASE(name) static void name(bb *b)
CASE(good_one_tensor)
{
    one_tensor(b, 2, ne_8x2, KN_TYPE_F32, 0, 64);
}
CASE(bad_magic)
{
    put(b, "GGUG", 4);
    u32(b, 3);
    u64(b, 0);
    u64(b, 0);
}
CASE(version_1)
{
    header(b, 1, 0, 0);
}
CASE(version_4)
{
    header(b, 4, 0, 0);
}
CASE(version_big_endian)
{
    header(b, 0x03000000, 0, 0);
}
CASE(n_kv_huge)
{
    header(b, 3, 0, UINT64_MAX / 2);
    kv_u32(b, "a", 1);
}
CASE(n_kv_slightly_too_many)
{
    header(b, 3, 0, 3);
    kv_u32(b, "a", 1);
}
CASE(n_tensors_huge)
{
    header(b, 3, UINT64_MAX, 0);
    tinfo(b, "t", 2, ne_8x2, KN_TYPE_F32, 0);
}
CASE(n_tensors_after_kvs)
{
    header(b, 3, 2, 1);
    kv_u32(b, "a", 1);
    tinfo(b, "t", 2, ne_8x2, KN_TYPE_F32, 0);
}
CASE(key_length_past_eof)
{
    header(b, 3, 0, 1);
    u64(b, 1000);
    put(b, "general.name", 12);
    u32(b, RT_GGUF_UINT8);
}
CASE(string_value_past_eof)
{
    header(b, 3, 0, 1);
    str(b, "general.name");
    u32(b, RT_GGUF_STRING);
    u64(b, UINT64_MAX);
    put(b, "abc", 3);
}
CASE(unknown_value_type)
{
    header(b, 3, 0, 1);
    str(b, "general.x");
    u32(b, 13);
    u32(b, 0);
}
CASE(array_unknown_type)
{
    header(b, 3, 0, 1);
    str(b, "tokenizer.ggml.scores");
    u32(b, RT_GGUF_ARRAY);
    u32(b, 77);
    u64(b, 1);
    u32(b, 0);
}
CASE(array_huge_count)
{
    header(b, 3, 0, 1);
    str(b, "tokenizer.ggml.scores");
    u32(b, RT_GGUF_ARRAY);
    u32(b, RT_GGUF_FLOAT32);
    u64(b, UINT64_MAX / 4 + 1);
    u32(b, 0);
}
CASE(array_huge_string_count)
{
    header(b, 3, 0, 1);
    str(b, "tokenizer.ggml.tokens");
    u32(b, RT_GGUF_ARRAY);
    u32(b, RT_GGUF_STRING);
    u64(b, 1ULL << 61);
    str(b, "a");
}
CASE(array_string_past_eof)
{
    header(b, 3, 0, 1);
    str(b, "tokenizer.ggml.tokens");
    u32(b, RT_GGUF_ARRAY);
    u32(b, RT_GGUF_STRING);
    u64(b, 2);
    str(b, "a");
    u64(b, 100);
    put(b, "bcd", 3);
}
CASE(array_nested_ok)
{
    header(b, 3, 0, 2);
    str(b, "x.nested");
    u32(b, RT_GGUF_ARRAY);
    u32(b, RT_GGUF_ARRAY);
    u64(b, 2);
    u32(b, RT_GGUF_UINT16); /* [ [1, 2], [ ["s"] ] ] */
    u64(b, 2);
    u32(b, 0x00020001);
    u32(b, RT_GGUF_ARRAY);
    u64(b, 1);
    u32(b, RT_GGUF_STRING);
    u64(b, 1);
    str(b, "s");
    kv_u32(b, "x.after", 7);
}
CASE(array_nested_too_deep)
{
    header(b, 3, 0, 1);
    str(b, "x.deep");
    u32(b, RT_GGUF_ARRAY);
    for (int d = 0; d < 20; d++) {
        u32(b, RT_GGUF_ARRAY);
        u64(b, 1);
    }
    u32(b, RT_GGUF_UINT8);
    u64(b, 0);
}
CASE(n_dims_0)
{
    one_tensor(b, 0, ne_8x2, KN_TYPE_F32, 0, 64);
}
CASE(n_dims_5)
{
    const uint64_t ne[5] = {8, 2, 1, 1, 1};
    one_tensor(b, 5, ne, KN_TYPE_F32, 0, 64);
}
CASE(ne_negative)
{
    const uint64_t ne[2] = {8, (uint64_t)-2};
    one_tensor(b, 2, ne, KN_TYPE_F32, 0, 64);
}
CASE(ne_overflow)
{
    const uint64_t ne[3] = {1ULL << 32, 1ULL << 31, 2};
    one_tensor(b, 3, ne, KN_TYPE_F32, 0, 64);
}
CASE(ne_overflow_behind_zero)
{
    const uint64_t ne[4] = {0, 1ULL << 32, 1ULL << 31, 2};
    one_tensor(b, 4, ne, KN_TYPE_F32, 0, 64);
}
CASE(bytes_overflow)
{
    const uint64_t ne[1] = {1ULL << 62}; /* 2^62 elements fit int64, 4 bytes each do not fit 64 bits */
    one_tensor(b, 1, ne, KN_TYPE_F32, 0, 64);
}
CASE(unknown_tensor_type)
{
    one_tensor(b, 2, ne_8x2, 99, 0, 64);
}
CASE(unsupported_ggml_type)
{
    one_tensor(b, 2, ne_8x2, 16 /* GGML_TYPE_IQ2_XXS */, 0, 64);
}
/* Every unsupported type is named with its count, not only the first. */
CASE(unsupported_types_listed)
{
    const uint64_t ne[2] = {256, 1};
    header(b, 3, 4, 0);
    tinfo(b, "a", 2, ne, KN_TYPE_Q4_K, 0);
    tinfo(b, "b", 2, ne, 16 /* IQ2_XXS */, 160);
    tinfo(b, "c", 2, ne, 21 /* IQ3_S */, 320);
    tinfo(b, "d", 2, ne, 16, 480);
    data(b, 32, 640);
}
CASE(ne0_not_block_multiple)
{
    const uint64_t ne[2] = {48, 2};
    one_tensor(b, 2, ne, KN_TYPE_Q8_0, 0, 3 * 34 * 2);
}
CASE(offset_misaligned)
{
    one_tensor(b, 2, ne_8x2, KN_TYPE_F32, 16, 96);
}
CASE(data_past_eof)
{
    one_tensor(b, 2, ne_8x2, KN_TYPE_F32, 0, 63);
}
CASE(offset_past_eof)
{
    one_tensor(b, 2, ne_8x2, KN_TYPE_F32, UINT64_MAX - 31, 64);
}
CASE(duplicate_tensor)
{
    header(b, 3, 2, 0);
    tinfo(b, "blk.0.attn_q.weight", 2, ne_8x2, KN_TYPE_F32, 0);
    tinfo(b, "blk.0.attn_q.weight", 2, ne_8x2, KN_TYPE_F32, 64);
    data(b, 32, 128);
}
CASE(duplicate_key)
{
    header(b, 3, 0, 3);
    kv_u32(b, "llama.block_count", 1);
    kv_u32(b, "llama.context_length", 1);
    kv_u32(b, "llama.block_count", 2);
}
CASE(alignment_not_pow2)
{
    header(b, 3, 0, 1);
    kv_u32(b, "general.alignment", 48);
}
CASE(alignment_zero)
{
    header(b, 3, 0, 1);
    kv_u32(b, "general.alignment", 0);
}
CASE(alignment_wrong_type)
{
    header(b, 3, 0, 1);
    str(b, "general.alignment");
    u32(b, RT_GGUF_UINT64);
    u64(b, 32);
}
CASE(alignment_64_offset_32)
{
    header(b, 3, 1, 1);
    kv_u32(b, "general.alignment", 64);
    tinfo(b, "t", 2, ne_8x2, KN_TYPE_F32, 32);
    data(b, 64, 96);
}
/* general.alignment 1 lets a tensor sit at any byte: an f32 one at an
 * address no float may be read from. */
CASE(alignment_1_f32_misaligned)
{
    header(b, 3, 1, 1);
    kv_u32(b, "general.alignment", 1);
    tinfo(b, "t", 2, ne_8x2, KN_TYPE_F32, 0);
    uint64_t off = b->n % 4 ? 0 : 1; /* the data section starts right here */
    memcpy(b->p + b->n - 8, &off, 8);
    data(b, 1, off + 64);
}
CASE(name_past_eof)
{
    header(b, 3, 1, 0);
    u64(b, 1ULL << 40);
    put(b, "blk", 3);
    u32(b, 1);
    u64(b, 8);
    u32(b, 0);
    u64(b, 0);
}
CASE(no_tensors_no_padding)
{
    header(b, 3, 0, 1);
    kv_u32(b, "a", 1); /* ends unpadded: ggml reads it, so do we */
}

typedef struct bad_case {
    const char *name;
    void (*build)(bb *);
    const char *want[3]; /* substrings of the message; NULL = the file is valid */
} bad_case;

static const bad_case cases[] = {
    {"good_one_tensor", good_one_tensor, {NULL}},
    {"array_nested_ok", array_nested_ok, {NULL}},
    {"no_tensors_no_padding", no_tensors_no_padding, {NULL}},
    {"bad_magic", bad_magic, {"magic at offset 0"}},
    {"version_1", version_1, {"version at offset 4", "v1"}},
    {"version_4", version_4, {"version at offset 4", "version 4"}},
    {"version_big_endian", version_big_endian, {"version", "big-endian"}},
    {"n_kv_huge", n_kv_huge, {"n_kv at offset 16"}},
    {"n_kv_slightly_too_many", n_kv_slightly_too_many, {"n_kv at offset 16"}},
    {"n_tensors_huge", n_tensors_huge, {"n_tensors at offset 8"}},
    {"n_tensors_after_kvs", n_tensors_after_kvs, {"n_tensors at offset 8"}},
    {"key_length_past_eof", key_length_past_eof, {"kv 0 key at offset 24", "string length 1000"}},
    {"string_value_past_eof",
     string_value_past_eof,
     {"kv 0 (\"general.name\") value at offset 48", "string length"}},
    {"unknown_value_type",
     unknown_value_type,
     {"kv 0 (\"general.x\") type at offset 41", "unknown value type 13"}},
    {"array_unknown_type",
     array_unknown_type,
     {"tokenizer.ggml.scores", "value at offset", "unknown value type 77"}},
    {"array_huge_count", array_huge_count, {"tokenizer.ggml.scores", "array count"}},
    {"array_huge_string_count", array_huge_string_count, {"tokenizer.ggml.tokens", "array count"}},
    {"array_string_past_eof",
     array_string_past_eof,
     {"tokenizer.ggml.tokens", "array element 1", "string length 100"}},
    {"array_nested_too_deep", array_nested_too_deep, {"x.deep", "nested"}},
    {"n_dims_0", n_dims_0, {"tensor 0 (\"blk.0.attn_q.weight\") n_dims at offset", "0 dimensions"}},
    {"n_dims_5", n_dims_5, {"n_dims at offset", "5 dimensions"}},
    {"ne_negative", ne_negative, {"ne[1] at offset", "-2 is negative"}},
    {"ne_overflow", ne_overflow, {"ne at offset", "overflows int64"}},
    {"ne_overflow_behind_zero", ne_overflow_behind_zero, {"ne at offset", "overflows int64"}},
    {"bytes_overflow", bytes_overflow, {"blk.0.attn_q.weight", "byte size"}},
    {"unknown_tensor_type",
     unknown_tensor_type,
     {"tensor 0 (\"blk.0.attn_q.weight\") type 99 at offset", "unknown tensor type"}},
    {"unsupported_ggml_type",
     unsupported_ggml_type,
     {"tensor 0 (\"blk.0.attn_q.weight\") type at offset", "does not read: IQ2_XXS (1 tensor);",
      "it reads F32, F16, Q4_0"}},
    {"unsupported_types_listed",
     unsupported_types_listed,
     {"tensor 1 (\"b\") type at offset", "IQ2_XXS (2 tensors), IQ3_S (1 tensor);", "Q4_K, Q5_K"}},
    {"ne0_not_block_multiple", ne0_not_block_multiple, {"ne[0]", "row length 48", "q8_0 block size 32"}},
    {"offset_misaligned", offset_misaligned, {"offset at offset", "data offset 16", "alignment 32"}},
    {"data_past_eof", data_past_eof, {"blk.0.attn_q.weight\") offset at offset", "past the end"}},
    {"offset_past_eof", offset_past_eof, {"offset at offset", "past the end"}},
    {"duplicate_tensor",
     duplicate_tensor,
     {"tensor 1 (\"blk.0.attn_q.weight\")", "duplicate tensor name", "tensor 0"}},
    {"duplicate_key", duplicate_key, {"kv 2 (\"llama.block_count\")", "duplicate key", "kv 0"}},
    {"alignment_not_pow2",
     alignment_not_pow2,
     {"kv 0 (\"general.alignment\") at offset", "alignment 48 is not a power of two"}},
    {"alignment_zero", alignment_zero, {"general.alignment", "alignment 0 is not a power of two"}},
    {"alignment_wrong_type", alignment_wrong_type, {"general.alignment", "must be of type u32, found u64"}},
    {"alignment_64_offset_32", alignment_64_offset_32, {"offset at offset", "alignment 64"}},
    {"name_past_eof", name_past_eof, {"tensor 0 name at offset 24", "string length"}},
    {"alignment_1_f32_misaligned",
     alignment_1_f32_misaligned,
     {"tensor 0 (\"t\") offset at offset", "is not a multiple of 4, which its type f32 needs"}},
};

static void test_bad_files(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        static bb b;
        memset(&b, 0, sizeof(b));
        cases[c].build(&b);
        rt_gguf *g = NULL;
        char err[512];
        void *keep;
        int rc = open_copy(b.p, b.n, &g, &keep, err, sizeof(err));
        if (!cases[c].want[0]) {
            if (rc != 0)
                fail_msg("%s: expected success, got %d: %s", cases[c].name, rc, err);
            rt_gguf_free(g);
            free(keep);
            continue;
        }
        if (rc != -EINVAL)
            fail_msg("%s: expected -EINVAL, got %d (%s)", cases[c].name, rc, err);
        assert_null(g);
        for (int k = 0; k < 3 && cases[c].want[k]; k++)
            if (!strstr(err, cases[c].want[k]))
                fail_msg("%s: message \"%s\" lacks \"%s\"", cases[c].name, err, cases[c].want[k]);
    }
}

/* Every prefix of a valid file shorter than its last tensor's end must fail
 * cleanly with a message; none may read past the prefix (ASan). */
static void test_truncations(void **state)
{
    (void)state;
    rt_gguf_writer *w = rt_gguf_writer_new();
    const char *const vocab[] = {"a", "bc", ""};
    const float scores[] = {0, -1, -2};
    int64_t ne[2] = {32, 2};
    uint8_t q[68];
    for (size_t k = 0; k < sizeof(q); k++)
        q[k] = (uint8_t)k;
    float f[3] = {1, 2, 3};
    int64_t ne1[1] = {3};
    assert_int_equal(rt_gguf_writer_add_str(w, "general.architecture", "llama"), 0);
    assert_int_equal(rt_gguf_writer_add_u32(w, "llama.block_count", 1), 0);
    assert_int_equal(rt_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", vocab, 3), 0);
    assert_int_equal(rt_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", scores, 3), 0);
    assert_int_equal(rt_gguf_writer_add_tensor(w, "norm", KN_TYPE_F32, 1, ne1, f, sizeof(f)), 0);
    assert_int_equal(rt_gguf_writer_add_tensor(w, "q", KN_TYPE_Q8_0, 2, ne, q, sizeof(q)), 0);
    size_t len;
    uint8_t *buf = written(w, &len);
    rt_gguf_writer_free(w);

    rt_gguf *g;
    char err[512];
    assert_int_equal(rt_gguf_open_mem(buf, len, &g, err, sizeof(err)), 0);
    const rt_gguf_tensor *t = rt_gguf_find_tensor(g, "q");
    size_t end = (size_t)(rt_gguf_data_offset(g) + t->offset + t->nbytes);
    assert_memory_equal(t->data, q, sizeof(q));
    rt_gguf_free(g);
    assert_true(end <= len);

    for (size_t n = 0; n < end; n++) {
        void *keep;
        int rc = open_copy(buf, n, &g, &keep, err, sizeof(err));
        if (rc != -EINVAL)
            fail_msg("prefix of %zu bytes: expected -EINVAL, got %d", n, rc);
        if (!strstr(err, " at offset "))
            fail_msg("prefix of %zu bytes: message \"%s\" names no offset", n, err);
    }
    for (size_t n = end; n <= len; n++) {
        uint8_t *copy = malloc(n);
        memcpy(copy, buf, n);
        assert_int_equal(rt_gguf_open_mem(copy, n, &g, err, sizeof(err)), 0);
        rt_gguf_free(g);
        free(copy);
    }
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars),         cmocka_unit_test(test_arrays),
        cmocka_unit_test(test_tensors_align32), cmocka_unit_test(test_tensors_align64),
        cmocka_unit_test(test_many_tensors),    cmocka_unit_test(test_v2),
        cmocka_unit_test(test_writer_errors),   cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_bad_files),       cmocka_unit_test(test_truncations),
    };
    return cmocka_run_group_tests(tests, setup_tmpdir, teardown_tmpdir);
}
