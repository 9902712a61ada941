/* Runs the GGUF fuzz target (tests/fuzz/fuzz_gguf.c, #included) inside the
 * regular test suite, so every build, the sanitizer build included, exercises
 * the fuzz path without clang: first over the seed corpus
 * (tests/fuzz/corpus_gguf/, found through INFERGATE_SOURCE_DIR or this file's
 * path; seeds generated in memory when neither is there), then over 20000
 * deterministic mutations of the seeds: bit flips, truncations, byte
 * insertions and deletions, and extreme values written over 32- and 64-bit
 * fields. Three seeds carry the keys of the newer families (gpt-oss, gemma2,
 * phi3), so the loader's hyper-parameters are read, and refused, too.
 *
 * INFERGATE_WRITE_SEEDS=<dir> writes the generated seeds to <dir>: that is how
 * the checked-in corpus was made. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "../fuzz/fuzz_gguf.c"

#include "kernels/kn.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#define N_MUTATIONS 20000

typedef struct seed {
    const char *name;
    uint8_t *p;
    size_t n;
} seed;

/* A v2 file with an array of arrays, which the writer cannot produce:
 * kv "x.nested" = [[1, 2] (u16), [["s"]]], kv "x.after" = 7 (u32). */
static const uint8_t nested_v2[] = {
    'G',
    'G',
    'U',
    'F',
    2,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    2,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    /* key */
    8,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    'x',
    '.',
    'n',
    'e',
    's',
    't',
    'e',
    'd',
    9,
    0,
    0,
    0,
    /* array of 2 arrays */
    9,
    0,
    0,
    0,
    2,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    /* [1, 2] as u16 */
    2,
    0,
    0,
    0,
    2,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    1,
    0,
    2,
    0,
    /* [["s"]] */
    9,
    0,
    0,
    0,
    1,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    8,
    0,
    0,
    0,
    1,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    1,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    's',
    /* "x.after" = 7 */
    7,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    'x',
    '.',
    'a',
    'f',
    't',
    'e',
    'r',
    4,
    0,
    0,
    0,
    7,
    0,
    0,
    0,
};

static seed write_seed(const char *name, rt_gguf_writer *w)
{
    seed s = {name, NULL, 0};
    void *buf;
    char err[256];
    assert_non_null(w);
    assert_int_equal(rt_gguf_writer_write_mem(w, &buf, &s.n, err, sizeof(err)), 0);
    s.p = buf;
    rt_gguf_writer_free(w);
    return s;
}

static seed seed_minimal(void)
{
    rt_gguf_writer *w = rt_gguf_writer_new();
    float x[4] = {1, -2, 3.5f, 0};
    int64_t ne[1] = {4};
    assert_int_equal(rt_gguf_writer_add_str(w, "general.architecture", "llama"), 0);
    assert_int_equal(rt_gguf_writer_add_tensor(w, "output_norm.weight", KN_TYPE_F32, 1, ne, x, sizeof(x)), 0);
    return write_seed("minimal", w);
}

static seed seed_kv_types(void)
{
    rt_gguf_writer *w = rt_gguf_writer_new();
    uint8_t u8 = 7;
    int8_t i8 = -7;
    uint16_t u16 = 700;
    int16_t i16 = -700;
    int64_t i64 = -7000000000LL;
    double f64 = 0.5;
    const uint8_t a8[] = {1, 2, 3};
    const int16_t a16[] = {-1, 1};
    const uint64_t a64[] = {UINT64_MAX};
    const double af64[] = {1e300, -1e-300};
    const bool ab[] = {true, false};
    const float af32[] = {0.5f, -0.25f};
    const int32_t ai32[] = {-5, 5};
    const char *const vocab[] = {"<unk>", "<s>", "</s>", "▁a", ""};
    assert_int_equal(rt_gguf_writer_add_scalar(w, "k.u8", RT_GGUF_UINT8, &u8), 0);
    assert_int_equal(rt_gguf_writer_add_scalar(w, "k.i8", RT_GGUF_INT8, &i8), 0);
    assert_int_equal(rt_gguf_writer_add_scalar(w, "k.u16", RT_GGUF_UINT16, &u16), 0);
    assert_int_equal(rt_gguf_writer_add_scalar(w, "k.i16", RT_GGUF_INT16, &i16), 0);
    assert_int_equal(rt_gguf_writer_add_u32(w, "k.u32", 70000), 0);
    assert_int_equal(rt_gguf_writer_add_i32(w, "k.i32", -70000), 0);
    assert_int_equal(rt_gguf_writer_add_f32(w, "k.f32", 1e10f), 0);
    assert_int_equal(rt_gguf_writer_add_bool(w, "k.bool", true), 0);
    assert_int_equal(rt_gguf_writer_add_str(w, "k.str", "hi"), 0);
    assert_int_equal(rt_gguf_writer_add_u64(w, "k.u64", 1ULL << 40), 0);
    assert_int_equal(rt_gguf_writer_add_scalar(w, "k.i64", RT_GGUF_INT64, &i64), 0);
    assert_int_equal(rt_gguf_writer_add_scalar(w, "k.f64", RT_GGUF_FLOAT64, &f64), 0);
    assert_int_equal(rt_gguf_writer_add_arr(w, "a.u8", RT_GGUF_UINT8, a8, 3), 0);
    assert_int_equal(rt_gguf_writer_add_arr(w, "a.i16", RT_GGUF_INT16, a16, 2), 0);
    assert_int_equal(rt_gguf_writer_add_arr(w, "a.u64", RT_GGUF_UINT64, a64, 1), 0);
    assert_int_equal(rt_gguf_writer_add_arr(w, "a.f64", RT_GGUF_FLOAT64, af64, 2), 0);
    assert_int_equal(rt_gguf_writer_add_arr(w, "a.bool", RT_GGUF_BOOL, ab, 2), 0);
    assert_int_equal(rt_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", af32, 2), 0);
    assert_int_equal(rt_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", ai32, 2), 0);
    assert_int_equal(rt_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", vocab, 5), 0);
    return write_seed("kv_types", w);
}

static seed seed_tensors_align64(void)
{
    static uint8_t q8[2 * 34], q4[2 * 18], f16[6 * 2];
    static float f32[3];
    for (size_t k = 0; k < sizeof(q8); k++)
        q8[k] = (uint8_t)(k * 7);
    for (size_t k = 0; k < sizeof(q4); k++)
        q4[k] = (uint8_t)(k * 13);
    for (size_t k = 0; k < sizeof(f16); k++)
        f16[k] = (uint8_t)k;
    rt_gguf_writer *w = rt_gguf_writer_new();
    int64_t ne_q8[2] = {32, 2}, ne_q4[2] = {64, 1}, ne_f16[2] = {3, 2}, ne_f32[1] = {3};
    assert_int_equal(rt_gguf_writer_add_u32(w, "general.alignment", 64), 0);
    assert_int_equal(rt_gguf_writer_add_str(w, "general.architecture", "llama"), 0);
    assert_int_equal(rt_gguf_writer_add_u32(w, "llama.block_count", 1), 0);
    assert_int_equal(
        rt_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", KN_TYPE_Q8_0, 2, ne_q8, q8, sizeof(q8)), 0);
    assert_int_equal(
        rt_gguf_writer_add_tensor(w, "blk.0.ffn_up.weight", KN_TYPE_Q4_0, 2, ne_q4, q4, sizeof(q4)), 0);
    assert_int_equal(
        rt_gguf_writer_add_tensor(w, "token_embd.weight", KN_TYPE_F16, 2, ne_f16, f16, sizeof(f16)), 0);
    assert_int_equal(
        rt_gguf_writer_add_tensor(w, "output_norm.weight", KN_TYPE_F32, 1, ne_f32, f32, sizeof(f32)), 0);
    return write_seed("tensors_align64", w);
}

static seed seed_nested_v2(void)
{
    seed s = {"nested_v2", malloc(sizeof(nested_v2)), sizeof(nested_v2)};
    assert_non_null(s.p);
    memcpy(s.p, nested_v2, sizeof(nested_v2));
    return s;
}

/* Keys "<arch>.<suffix>" of one value each. */
static void arch_u32(rt_gguf_writer *w, const char *arch, const char *suffix, uint32_t v)
{
    char key[96];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    assert_int_equal(rt_gguf_writer_add_u32(w, key, v), 0);
}

static void arch_f32(rt_gguf_writer *w, const char *arch, const char *suffix, float v)
{
    char key[96];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    assert_int_equal(rt_gguf_writer_add_f32(w, key, v), 0);
}

static void arch_str(rt_gguf_writer *w, const char *arch, const char *suffix, const char *v)
{
    char key[96];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    assert_int_equal(rt_gguf_writer_add_str(w, key, v), 0);
}

/* The keys of one of the newer families and the embeddings the loader's
 * hyper-parameters need (8 wide, 4 tokens), for fuzz_hparams. */
static seed seed_arch(const char *name, const char *arch)
{
    rt_gguf_writer *w = rt_gguf_writer_new();
    float x[32] = {0};
    int64_t ne[2] = {8, 4};
    assert_int_equal(rt_gguf_writer_add_str(w, "general.architecture", arch), 0);
    arch_u32(w, arch, "context_length", 64);
    arch_u32(w, arch, "embedding_length", 8);
    arch_u32(w, arch, "block_count", 2);
    arch_u32(w, arch, "attention.head_count", 2);
    arch_u32(w, arch, "attention.head_count_kv", 1);
    arch_u32(w, arch, "feed_forward_length", 16);
    arch_u32(w, arch, "attention.sliding_window", 4);
    if (!strcmp(arch, "gpt-oss")) {
        arch_u32(w, arch, "expert_count", 4);
        arch_u32(w, arch, "expert_used_count", 2);
        arch_u32(w, arch, "expert_feed_forward_length", 16);
        arch_str(w, arch, "rope.scaling.type", "yarn");
        arch_f32(w, arch, "rope.scaling.factor", 32.0f);
        arch_u32(w, arch, "rope.scaling.original_context_length", 16);
    } else if (!strcmp(arch, "gemma2")) {
        arch_f32(w, arch, "attn_logit_softcapping", 50.0f);
        arch_f32(w, arch, "final_logit_softcapping", 30.0f);
    } else {
        arch_str(w, arch, "rope.scaling.type", "longrope");
        arch_u32(w, arch, "rope.scaling.original_context_length", 16);
        arch_f32(w, arch, "rope.scaling.attn_factor", 1.19f);
    }
    assert_int_equal(rt_gguf_writer_add_tensor(w, "token_embd.weight", KN_TYPE_F32, 2, ne, x, sizeof(x)), 0);
    return write_seed(name, w);
}

#define N_SEEDS 7
#define FIRST_ARCH_SEED 4

static void make_seeds(seed *out)
{
    out[0] = seed_minimal();
    out[1] = seed_kv_types();
    out[2] = seed_tensors_align64();
    out[3] = seed_nested_v2();
    out[4] = seed_arch("arch_gpt_oss", "gpt-oss");
    out[5] = seed_arch("arch_gemma2", "gemma2");
    out[6] = seed_arch("arch_phi3", "phi3");
}

/* Runs the target over an exact-size copy, so that ASan sees over-reads. */
static void run_one(const uint8_t *p, size_t n)
{
    uint8_t *copy = malloc(n ? n : 1);
    assert_non_null(copy);
    if (n)
        memcpy(copy, p, n);
    LLVMFuzzerTestOneInput(copy, n);
    free(copy);
}

static void test_generated_seeds(void **state)
{
    (void)state;
    seed seeds[N_SEEDS];
    make_seeds(seeds);
    const char *dir = getenv("INFERGATE_WRITE_SEEDS");
    for (int i = 0; i < N_SEEDS; i++) {
        rt_gguf *g;
        char err[256];
        if (rt_gguf_open_mem(seeds[i].p, seeds[i].n, &g, err, sizeof(err)) != 0)
            fail_msg("seed %s does not parse: %s", seeds[i].name, err);
        if (i >= FIRST_ARCH_SEED) { /* they reach the hyper-parameters' checks and pass them */
            rt_hparams hp;
            if (rt_hparams_from_gguf(g, &hp, err, sizeof(err)) != 0)
                fail_msg("seed %s: %s", seeds[i].name, err);
        }
        rt_gguf_free(g);
        run_one(seeds[i].p, seeds[i].n);
        if (dir) {
            char path[1024];
            snprintf(path, sizeof(path), "%s/%s", dir, seeds[i].name);
            FILE *f = fopen(path, "wb");
            assert_non_null(f);
            assert_int_equal(fwrite(seeds[i].p, 1, seeds[i].n, f), seeds[i].n);
            assert_int_equal(fclose(f), 0);
        }
        free(seeds[i].p);
    }
}

static int seed_dir(char *out, size_t cap)
{
    const char *src = getenv("INFERGATE_SOURCE_DIR");
    if (src) {
        snprintf(out, cap, "%s/tests/fuzz/corpus_gguf", src);
        return 0;
    }
    const char *file = __FILE__;
    const char *slash = strrchr(file, '/');
    if (!slash)
        return -1;
    snprintf(out, cap, "%.*s/../fuzz/corpus_gguf", (int)(slash - file), file);
    return 0;
}

static void test_corpus(void **state)
{
    (void)state;
    char dir[1024];
    DIR *d = seed_dir(dir, sizeof(dir)) == 0 ? opendir(dir) : NULL;
    if (!d) {
        print_message("no seed corpus at %s; the generated seeds stand in\n", dir);
        return;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char path[2048];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        struct stat st;
        if (e->d_name[0] == '.' || stat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (1 << 20))
            continue;
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        uint8_t *buf = malloc((size_t)st.st_size + 1);
        assert_non_null(buf);
        size_t got = fread(buf, 1, (size_t)st.st_size, f);
        fclose(f);
        run_one(buf, got);
        free(buf);
        n++;
    }
    closedir(d);
    assert_true(n > 0);
}

static uint64_t rng_state = 0x243f6a8885a308d3ULL;

static uint64_t rng(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int k = 0; k < n; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

/* One random edit of buf (length *n, capacity cap). */
static void mutate(uint8_t *buf, size_t *n, size_t cap)
{
    static const uint64_t extreme64[] = {
        0,
        1,
        2,
        3,
        4,
        5,
        31,
        32,
        33,
        63,
        64,
        0x7f,
        0xff,
        0xffff,
        0xffffffffULL,
        0x100000000ULL,
        INT64_MAX,
        (uint64_t)INT64_MAX + 1,
        UINT64_MAX,
        UINT64_MAX - 1,
        UINT64_MAX - 31,
        1ULL << 62,
        (uint64_t)-2,
        (uint64_t)-32,
        1ULL << 32,
        1ULL << 31,
    };
    static const uint32_t extreme32[] = {
        0,  1,  2,  3,  4,  5,  6,  7,  8,  9,           10,          11,
        12, 13, 14, 99, 16, 31, 32, 48, 64, 0x80000000u, 0xffffffffu, 0x03000000u,
    };
    size_t len = *n;
    size_t pos = len ? (size_t)(rng() % len) : 0;
    switch (rng() % 7) {
    case 0:
    case 1: /* bit flip */
        if (len)
            buf[pos] ^= (uint8_t)(1u << (rng() % 8));
        break;
    case 2: /* truncation */
        *n = len ? (size_t)(rng() % len) : 0;
        break;
    case 3: { /* insertion of 1..8 random bytes */
        size_t k = 1 + (size_t)(rng() % 8);
        if (len + k > cap)
            break;
        memmove(buf + pos + k, buf + pos, len - pos);
        for (size_t i = 0; i < k; i++)
            buf[pos + i] = (uint8_t)rng();
        *n = len + k;
        break;
    }
    case 4: { /* deletion of 1..16 bytes */
        size_t k = 1 + (size_t)(rng() % 16);
        if (pos + k > len)
            k = len - pos;
        memmove(buf + pos, buf + pos + k, len - pos - k);
        *n = len - k;
        break;
    }
    case 5: /* a 64-bit field (count, length, dimension, offset) set to an extreme */
        if (pos + 8 <= len)
            put_le(buf + pos, extreme64[rng() % (sizeof(extreme64) / sizeof(extreme64[0]))], 8);
        break;
    default: /* a 32-bit field (type, n_dims, version, alignment) set to an extreme */
        if (pos + 4 <= len)
            put_le(buf + pos, extreme32[rng() % (sizeof(extreme32) / sizeof(extreme32[0]))], 4);
        break;
    }
}

static void test_mutations(void **state)
{
    (void)state;
    seed seeds[N_SEEDS];
    make_seeds(seeds);
    size_t cap = 0;
    for (int i = 0; i < N_SEEDS; i++)
        cap = seeds[i].n > cap ? seeds[i].n : cap;
    cap += 256;
    uint8_t *buf = malloc(cap);
    assert_non_null(buf);
    int parsed = 0, models = 0;
    for (int it = 0; it < N_MUTATIONS; it++) {
        const seed *s = &seeds[it % N_SEEDS];
        size_t n = s->n;
        memcpy(buf, s->p, n);
        int edits = 1 + (int)(rng() % 4);
        for (int k = 0; k < edits; k++)
            mutate(buf, &n, cap);
        rt_gguf *g;
        char err[256];
        if (rt_gguf_open_mem(buf, n, &g, err, sizeof(err)) == 0) {
            parsed++;
            rt_hparams hp;
            models += rt_hparams_from_gguf(g, &hp, err, sizeof(err)) == 0;
            rt_gguf_free(g);
        }
        run_one(buf, n);
    }
    /* Both paths must be exercised: the walk of files that parse and the
     * rejections. */
    print_message("%d of %d mutations still parse, %d of them with hyper-parameters the loader takes\n", parsed,
                  N_MUTATIONS, models);
    assert_true(parsed > N_MUTATIONS / 50 && parsed < N_MUTATIONS - N_MUTATIONS / 50);
    assert_true(models > 0 && models < parsed);
    free(buf);
    for (int i = 0; i < N_SEEDS; i++)
        free(seeds[i].p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generated_seeds),
        cmocka_unit_test(test_corpus),
        cmocka_unit_test(test_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
