/* GGUF v2/v3 reader and v3 writer (see gguf.h for the layout).
 *
 * The reader maps the file read-only and builds a small index over it: one
 * record per key/value pair and per tensor, plus hash tables for lookup by
 * name. Nothing in the file is trusted: every count and length is checked
 * against the bytes that remain before it is used or allocated for, all size
 * arithmetic is overflow-checked in uint64_t, and multi-byte fields are
 * decoded byte by byte (the mapping gives no alignment guarantee for
 * metadata, and this keeps the decoder independent of host byte order).
 *
 * The writer keeps every value already encoded, so writing is a straight
 * sequence of buffered stdio writes, each one checked. */
#include "runtime/gguf.h"
#include "runtime/hash.h"

#include "kernels/kn.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC "GGUF"
#define GGUF_HEADER_BYTES 24
/* Nested arrays are legal but nothing uses them; the bound keeps the
 * recursive skip from exhausting the stack on a hostile file. */
#define GGUF_MAX_ARRAY_DEPTH 8
/* Smallest possible encodings, used to reject hostile counts before any
 * allocation: a kv is a key length, a type and at least a one-byte value; a
 * tensor info is a name length, n_dims, one dimension, a type and an offset. */
#define GGUF_MIN_KV_BYTES (8 + 4 + 1)
#define GGUF_MIN_TENSOR_BYTES (8 + 4 + 8 + 4 + 8)
#define GGUF_MIN_ARRAY_BYTES (4 + 8)
#define GGUF_VTYPE_COUNT 13
#define GGUF_BAD_VTYPE ((rt_gguf_vtype)-1)

/* ---- little-endian decoding ---- */

static uint16_t le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* Byte size of a fixed-size value type; 0 for strings, arrays and unknown. */
static size_t vtype_size(uint32_t t)
{
    static const uint8_t sizes[GGUF_VTYPE_COUNT] = {
        [RT_GGUF_UINT8] = 1,  [RT_GGUF_INT8] = 1,  [RT_GGUF_UINT16] = 2,  [RT_GGUF_INT16] = 2,
        [RT_GGUF_UINT32] = 4, [RT_GGUF_INT32] = 4, [RT_GGUF_FLOAT32] = 4, [RT_GGUF_BOOL] = 1,
        [RT_GGUF_UINT64] = 8, [RT_GGUF_INT64] = 8, [RT_GGUF_FLOAT64] = 8,
    };
    return t < GGUF_VTYPE_COUNT ? sizes[t] : 0;
}

static const char *vtype_name(uint32_t t)
{
    static const char *const names[GGUF_VTYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
    };
    return t < GGUF_VTYPE_COUNT ? names[t] : "unknown";
}

/* ---- name index: open addressing over rt_hash_bytes, shared by keys and tensors.
 * Records of both kinds start with their rt_gguf_str name, so the index
 * reaches a name through the record array and its stride. */

typedef struct name_index {
    int64_t *slots; /* record index, -1 when empty */
    uint64_t mask;
    uint64_t key; /* rt_hash_key() */
} name_index;

static int index_init(name_index *ix, uint64_t n)
{
    uint64_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    ix->slots = malloc(cap * sizeof(*ix->slots));
    if (!ix->slots)
        return -ENOMEM;
    memset(ix->slots, 0xff, cap * sizeof(*ix->slots));
    ix->mask = cap - 1;
    ix->key = rt_hash_key();
    return 0;
}

static const rt_gguf_str *record_name(const void *records, size_t stride, int64_t i)
{
    return (const rt_gguf_str *)((const char *)records + (size_t)i * stride);
}

static bool str_eq_bytes(rt_gguf_str s, const char *p, uint64_t n)
{
    return s.n == n && (n == 0 || memcmp(s.p, p, n) == 0);
}

/* Returns the slot holding name, or the empty slot where it would go. */
static uint64_t index_probe(const name_index *ix, const void *records, size_t stride, const char *p,
                            uint64_t n)
{
    uint64_t s = rt_hash_bytes(p, (size_t)n, ix->key) & ix->mask;
    while (ix->slots[s] >= 0 && !str_eq_bytes(*record_name(records, stride, ix->slots[s]), p, n))
        s = (s + 1) & ix->mask;
    return s;
}

static int64_t index_find(const name_index *ix, const void *records, size_t stride, const char *p, uint64_t n)
{
    if (!ix->slots)
        return -1;
    return ix->slots[index_probe(ix, records, stride, p, n)];
}

/* ---- reader ---- */

typedef struct gguf_kv {
    rt_gguf_str key; /* must stay first: see name_index */
    uint32_t type;
    uint32_t arr_type;  /* arrays only */
    uint64_t arr_n;     /* arrays only */
    uint64_t off;       /* value, or first array element, in the file */
    uint64_t end;       /* just past the value */
    uint64_t *str_offs; /* string arrays: offset of each element's length */
} gguf_kv;

struct rt_gguf {
    const uint8_t *base;
    uint64_t size;
    void *map; /* NULL for rt_gguf_open_mem */
    size_t map_len;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_off;
    int64_t n_kv;
    gguf_kv *kv;
    name_index kv_index;
    int64_t n_tensors;
    rt_gguf_tensor *tensors;
    name_index tensor_index;
};

typedef struct parser {
    rt_gguf *g;
    const uint8_t *p;
    uint64_t size;
    uint64_t pos;
    char *err;
    size_t err_len;
} parser;

/* Writes `<where> at offset <off>: <message>` and returns -EINVAL. */
static int fail(parser *ps, const char *where, uint64_t off, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(parser *ps, const char *where, uint64_t off, const char *fmt, ...)
{
    if (!ps->err || ps->err_len == 0)
        return -EINVAL;
    int n = snprintf(ps->err, ps->err_len, "%s at offset %" PRIu64 ": ", where, off);
    if (n >= 0 && (size_t)n < ps->err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ps->err + n, ps->err_len - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

const char *rt_gguf_printable(char *dst, size_t cap, rt_gguf_str s)
{
    size_t limit = cap - 4, o = 0;
    for (uint64_t i = 0; i < s.n; i++) {
        if (o >= limit) {
            memcpy(dst + o - 3, "...", 3);
            break;
        }
        unsigned char c = (unsigned char)s.p[i];
        dst[o++] = (c >= 0x20 && c < 0x7f && c != '"') ? (char)c : '?';
    }
    dst[o] = '\0';
    return dst;
}

static uint64_t remain(const parser *ps)
{
    return ps->size - ps->pos;
}

static int need(parser *ps, const char *where, uint64_t n)
{
    if (remain(ps) >= n)
        return 0;
    return fail(ps, where, ps->pos, "truncated file: needs %" PRIu64 " bytes, %" PRIu64 " remain", n,
                remain(ps));
}

static int read_u32(parser *ps, const char *where, uint32_t *v)
{
    int rc = need(ps, where, 4);
    if (rc < 0)
        return rc;
    *v = le32(ps->p + ps->pos);
    ps->pos += 4;
    return 0;
}

static int read_u64(parser *ps, const char *where, uint64_t *v)
{
    int rc = need(ps, where, 8);
    if (rc < 0)
        return rc;
    *v = le64(ps->p + ps->pos);
    ps->pos += 8;
    return 0;
}

static int read_str(parser *ps, const char *where, rt_gguf_str *s)
{
    uint64_t off = ps->pos, n;
    int rc = read_u64(ps, where, &n);
    if (rc < 0)
        return rc;
    if (n > remain(ps))
        return fail(ps, where, off,
                    "string length %" PRIu64 " runs past the end of the file (%" PRIu64 " bytes remain)", n,
                    remain(ps));
    s->p = (const char *)ps->p + ps->pos;
    s->n = n;
    ps->pos += n;
    return 0;
}

static int read_vtype(parser *ps, const char *where, uint32_t *t)
{
    uint64_t off = ps->pos;
    int rc = read_u32(ps, where, t);
    if (rc < 0)
        return rc;
    if (*t >= GGUF_VTYPE_COUNT)
        return fail(ps, where, off, "unknown value type %" PRIu32, *t);
    return 0;
}

/* Reads an array's element type and count, and checks the count against the
 * smallest encoding of that many elements. */
static int read_array_header(parser *ps, const char *where, uint32_t *et, uint64_t *n)
{
    int rc = read_vtype(ps, where, et);
    if (rc < 0)
        return rc;
    uint64_t off = ps->pos;
    if ((rc = read_u64(ps, where, n)) < 0)
        return rc;
    uint64_t min = *et == RT_GGUF_STRING ? 8 : *et == RT_GGUF_ARRAY ? GGUF_MIN_ARRAY_BYTES : vtype_size(*et);
    if (*n > remain(ps) / min)
        return fail(ps, where, off,
                    "array count %" PRIu64 " of %s needs more than the %" PRIu64 " bytes that remain", *n,
                    vtype_name(*et), remain(ps));
    return 0;
}

/* Skips n strings; when offs is not NULL, records where each one starts. */
static int skip_strings(parser *ps, const char *where, uint64_t n, uint64_t *offs)
{
    for (uint64_t j = 0; j < n; j++) {
        uint64_t off = ps->pos;
        if (remain(ps) < 8)
            return fail(ps, where, off,
                        "array element %" PRIu64 ": truncated file: needs 8 bytes, %" PRIu64 " remain", j,
                        remain(ps));
        uint64_t len = le64(ps->p + off);
        if (len > remain(ps) - 8)
            return fail(ps, where, off,
                        "array element %" PRIu64 ": string length %" PRIu64
                        " runs past the end of the file (%" PRIu64 " bytes remain)",
                        j, len, remain(ps) - 8);
        if (offs)
            offs[j] = off;
        ps->pos += 8 + len;
    }
    return 0;
}

/* Skips n arrays (elements of an array of arrays). */
static int skip_arrays(parser *ps, const char *where, uint64_t n, int depth)
{
    for (uint64_t j = 0; j < n; j++) {
        if (depth >= GGUF_MAX_ARRAY_DEPTH)
            return fail(ps, where, ps->pos, "arrays nested deeper than %d levels", GGUF_MAX_ARRAY_DEPTH);
        uint32_t et;
        uint64_t m;
        int rc = read_array_header(ps, where, &et, &m);
        if (rc < 0)
            return rc;
        if (et == RT_GGUF_STRING)
            rc = skip_strings(ps, where, m, NULL);
        else if (et == RT_GGUF_ARRAY)
            rc = skip_arrays(ps, where, m, depth + 1);
        else
            ps->pos += m * vtype_size(et); /* bounded by read_array_header */
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int parse_value(parser *ps, const char *where, gguf_kv *kv)
{
    int rc;
    if (kv->type == RT_GGUF_STRING) {
        rt_gguf_str s;
        kv->off = ps->pos;
        return read_str(ps, where, &s);
    }
    if (kv->type != RT_GGUF_ARRAY) {
        if ((rc = need(ps, where, vtype_size(kv->type))) < 0)
            return rc;
        kv->off = ps->pos;
        ps->pos += vtype_size(kv->type);
        return 0;
    }
    if ((rc = read_array_header(ps, where, &kv->arr_type, &kv->arr_n)) < 0)
        return rc;
    kv->off = ps->pos;
    if (kv->arr_type == RT_GGUF_STRING) {
        /* Vocabularies are looked up by index, so string arrays get an
         * offset table; the count was bounded by the bytes that remain. */
        kv->str_offs = malloc((kv->arr_n ? kv->arr_n : 1) * sizeof(*kv->str_offs));
        if (!kv->str_offs)
            return -ENOMEM;
        return skip_strings(ps, where, kv->arr_n, kv->str_offs);
    }
    if (kv->arr_type == RT_GGUF_ARRAY)
        return skip_arrays(ps, where, kv->arr_n, 1);
    ps->pos += kv->arr_n * vtype_size(kv->arr_type);
    return 0;
}

static int check_alignment(parser *ps, const char *where, const gguf_kv *kv)
{
    if (kv->type != RT_GGUF_UINT32)
        return fail(ps, where, kv->off, "alignment must be of type u32, found %s", vtype_name(kv->type));
    uint32_t a = le32(ps->p + kv->off);
    if (a == 0 || (a & (a - 1)) != 0)
        return fail(ps, where, kv->off, "alignment %" PRIu32 " is not a power of two", a);
    ps->g->alignment = a;
    return 0;
}

static int parse_kvs(parser *ps)
{
    rt_gguf *g = ps->g;
    char where[160], name[64];
    int rc;
    for (int64_t i = 0; i < g->n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        snprintf(where, sizeof(where), "kv %" PRId64 " key", i);
        if ((rc = read_str(ps, where, &kv->key)) < 0)
            return rc;
        snprintf(where, sizeof(where), "kv %" PRId64 " (\"%s\")", i,
                 rt_gguf_printable(name, sizeof(name), kv->key));
        uint64_t slot = index_probe(&g->kv_index, g->kv, sizeof(*g->kv), kv->key.p, kv->key.n);
        if (g->kv_index.slots[slot] >= 0)
            return fail(ps, where, ps->pos - kv->key.n - 8, "duplicate key (first defined by kv %" PRId64 ")",
                        g->kv_index.slots[slot]);
        g->kv_index.slots[slot] = i;
        char field[sizeof(where) + 16];
        snprintf(field, sizeof(field), "%s type", where);
        if ((rc = read_vtype(ps, field, &kv->type)) < 0)
            return rc;
        snprintf(field, sizeof(field), "%s value", where);
        if ((rc = parse_value(ps, field, kv)) < 0)
            return rc;
        kv->end = ps->pos;
        if (rt_gguf_str_eq(kv->key, "general.alignment") && (rc = check_alignment(ps, where, kv)) < 0)
            return rc;
    }
    return 0;
}

/* Element count and byte size of a tensor, or -EINVAL with err filled. */
static int tensor_size(parser *ps, const char *where, uint64_t ne_off, rt_gguf_tensor *t)
{
    char field[192];
    /* The product of the nonzero dimensions must fit too: a zero elsewhere
     * must not hide an overflowing shape. */
    int64_t prod = 1;
    bool zero = false;
    for (int j = 0; j < RT_GGUF_MAX_DIMS; j++) {
        int64_t d = t->ne[j] ? t->ne[j] : 1;
        zero |= t->ne[j] == 0;
        if (prod > INT64_MAX / d) {
            snprintf(field, sizeof(field), "%s ne", where);
            return fail(ps, field, ne_off,
                        "element count of [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                        "] overflows int64",
                        t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
        }
        prod *= d;
    }
    uint64_t nelem = zero ? 0 : (uint64_t)prod;
    uint64_t blk = (uint64_t)kn_type_block_elems(t->type), blk_bytes = kn_type_block_bytes(t->type);
    if ((uint64_t)t->ne[0] % blk != 0) {
        snprintf(field, sizeof(field), "%s ne[0]", where);
        return fail(ps, field, ne_off,
                    "row length %" PRId64 " is not a multiple of the %s block size %" PRIu64, t->ne[0],
                    kn_type_name(t->type), blk);
    }
    uint64_t nblocks = nelem / blk;
    if (nblocks > UINT64_MAX / blk_bytes) {
        snprintf(field, sizeof(field), "%s ne", where);
        return fail(ps, field, ne_off, "byte size of %" PRIu64 " %s elements overflows 64 bits", nelem,
                    kn_type_name(t->type));
    }
    t->nbytes = nblocks * blk_bytes;
    return 0;
}

/* The tensors of types this build does not read, by ggml type number. */
typedef struct unsupported_types {
    int64_t n_tensors, first; /* first: the index of the first such tensor */
    uint64_t off;             /* where its type is */
    uint32_t count[64];
} unsupported_types;

/* Refuses a file with tensors of types this build does not read, naming
 * each type with its tensor count, and the types it does read. */
static int refuse_unsupported(parser *ps, const unsupported_types *u)
{
    char list[512] = "", known[256] = "", where[160], name[64];
    size_t o = 0, k = 0;
    for (uint32_t t = 0; t < 64; t++) {
        if (u->count[t] > 0 && o < sizeof(list))
            o += (size_t)snprintf(list + o, sizeof(list) - o, "%s%s (%" PRIu32 " tensor%s)", o ? ", " : "",
                                  kn_ggml_type_name(t), u->count[t], u->count[t] == 1 ? "" : "s");
        if (kn_type_supported(t) && k < sizeof(known))
            k += (size_t)snprintf(known + k, sizeof(known) - k, "%s%s", k ? ", " : "", kn_ggml_type_name(t));
    }
    snprintf(where, sizeof(where), "tensor %" PRId64 " (\"%s\") type", u->first,
             rt_gguf_printable(name, sizeof(name), ps->g->tensors[u->first].name));
    return fail(ps, where, u->off, "tensor types this build does not read: %s; it reads %s", list, known);
}

static int parse_tensor_infos(parser *ps, uint64_t *offset_pos, unsupported_types *unsupported)
{
    rt_gguf *g = ps->g;
    char where[160], field[192], name[64];
    int rc;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        rt_gguf_tensor *t = &g->tensors[i];
        snprintf(where, sizeof(where), "tensor %" PRId64 " name", i);
        if ((rc = read_str(ps, where, &t->name)) < 0)
            return rc;
        snprintf(where, sizeof(where), "tensor %" PRId64 " (\"%s\")", i,
                 rt_gguf_printable(name, sizeof(name), t->name));
        uint64_t slot = index_probe(&g->tensor_index, g->tensors, sizeof(*g->tensors), t->name.p, t->name.n);
        if (g->tensor_index.slots[slot] >= 0)
            return fail(ps, where, ps->pos - t->name.n - 8,
                        "duplicate tensor name (first defined by tensor %" PRId64 ")",
                        g->tensor_index.slots[slot]);
        g->tensor_index.slots[slot] = i;

        uint64_t off = ps->pos;
        snprintf(field, sizeof(field), "%s n_dims", where);
        if ((rc = read_u32(ps, field, &t->n_dims)) < 0)
            return rc;
        if (t->n_dims < 1 || t->n_dims > RT_GGUF_MAX_DIMS)
            return fail(ps, field, off, "%" PRIu32 " dimensions, must be 1 to %d", t->n_dims,
                        RT_GGUF_MAX_DIMS);
        uint64_t ne_off = ps->pos;
        for (int j = 0; j < RT_GGUF_MAX_DIMS; j++) {
            t->ne[j] = 1;
            if ((uint32_t)j >= t->n_dims)
                continue;
            uint64_t v;
            off = ps->pos;
            snprintf(field, sizeof(field), "%s ne[%d]", where, j);
            if ((rc = read_u64(ps, field, &v)) < 0)
                return rc;
            if (v > INT64_MAX)
                return fail(ps, field, off, "dimension %" PRId64 " is negative", (int64_t)v);
            t->ne[j] = (int64_t)v;
        }

        off = ps->pos;
        snprintf(field, sizeof(field), "%s type", where);
        if ((rc = read_u32(ps, field, &t->type)) < 0)
            return rc;
        if (!kn_type_supported(t->type)) {
            /* A type ggml has but this build does not read: counted, and
             * refused once every tensor is seen, so that one message names
             * them all. A number ggml never gave is a broken file. */
            if (kn_ggml_type_name(t->type) == NULL) {
                snprintf(field, sizeof(field), "%s type %" PRIu32, where, t->type);
                return fail(ps, field, off, "unknown tensor type");
            }
            if (unsupported->n_tensors++ == 0) {
                unsupported->first = i;
                unsupported->off = off;
            }
            unsupported->count[t->type]++;
        } else if ((rc = tensor_size(ps, where, ne_off, t)) < 0) {
            return rc;
        }

        off = ps->pos;
        snprintf(field, sizeof(field), "%s offset", where);
        if ((rc = read_u64(ps, field, &t->offset)) < 0)
            return rc;
        if (t->offset % g->alignment != 0)
            return fail(ps, field, off, "data offset %" PRIu64 " is not a multiple of the alignment %" PRIu32,
                        t->offset, g->alignment);
        offset_pos[i] = off;
    }
    return 0;
}

/* The data section starts at the first aligned offset after the tensor
 * infos. A file without tensor data may end before it (ggml writes the
 * padding, but an fseek past EOF lets it read files that lack it). */
static int place_tensor_data(parser *ps, const uint64_t *offset_pos)
{
    rt_gguf *g = ps->g;
    uint64_t a = g->alignment;
    if (ps->pos > UINT64_MAX - (a - 1))
        return fail(ps, "data section", ps->pos, "start overflows");
    g->data_off = (ps->pos + a - 1) / a * a;
    uint64_t data_size = g->data_off < ps->size ? ps->size - g->data_off : 0;
    char where[192], name[64];
    for (int64_t i = 0; i < g->n_tensors; i++) {
        rt_gguf_tensor *t = &g->tensors[i];
        snprintf(where, sizeof(where), "tensor %" PRId64 " (\"%s\") offset", i,
                 rt_gguf_printable(name, sizeof(name), t->name));
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            return fail(ps, where, offset_pos[i],
                        "data [%" PRIu64 ", %" PRIu64 " + %" PRIu64 ") runs past the end of the file "
                        "(data section holds %" PRIu64 " bytes from offset %" PRIu64 ")",
                        t->offset, t->offset, t->nbytes, data_size, g->data_off);
        uint64_t at = g->data_off + t->offset;
        t->data = ps->p + (at < ps->size ? at : ps->size);
        /* The kernels read an F32 as float and a block's scale as a
         * half: at an address of their alignment, which a file with
         * general.alignment 1 or 2 need not give (ggml writes 32). */
        uint64_t need = t->type == KN_TYPE_F32 ? 4 : 2;
        if (at % need || (uintptr_t)t->data % need)
            return fail(ps, where, offset_pos[i],
                        "data at file offset %" PRIu64 " is not a multiple of %" PRIu64
                        ", which its type %s needs",
                        at, need, kn_type_name(t->type));
    }
    return 0;
}

static int parse(parser *ps)
{
    rt_gguf *g = ps->g;
    int rc;
    if (ps->size < 4)
        return fail(ps, "magic", 0, "file is %" PRIu64 " bytes, too short for a GGUF header", ps->size);
    if (memcmp(ps->p, GGUF_MAGIC, 4) != 0)
        return fail(ps, "magic", 0, "expected \"GGUF\", found bytes %02x %02x %02x %02x", ps->p[0], ps->p[1],
                    ps->p[2], ps->p[3]);
    ps->pos = 4;
    if ((rc = read_u32(ps, "version", &g->version)) < 0)
        return rc;
    if (g->version == 1)
        return fail(ps, "version", 4, "GGUF v1 is not supported (only v2 and v3 are)");
    if (g->version == 0x02000000 || g->version == 0x03000000)
        return fail(ps, "version", 4, "big-endian GGUF files are not supported");
    if (g->version != 2 && g->version != 3)
        return fail(ps, "version", 4, "unsupported GGUF version %" PRIu32 " (only v2 and v3 are)",
                    g->version);

    uint64_t n_tensors, n_kv;
    if ((rc = read_u64(ps, "n_tensors", &n_tensors)) < 0 || (rc = read_u64(ps, "n_kv", &n_kv)) < 0)
        return rc;
    uint64_t rem = remain(ps);
    if (n_kv > rem / GGUF_MIN_KV_BYTES)
        return fail(ps, "n_kv", 16,
                    "%" PRIu64 " key/value pairs cannot fit in the %" PRIu64 " remaining bytes", n_kv, rem);
    if (n_tensors > rem / GGUF_MIN_TENSOR_BYTES ||
        n_tensors * GGUF_MIN_TENSOR_BYTES > rem - n_kv * GGUF_MIN_KV_BYTES)
        return fail(ps, "n_tensors", 8,
                    "%" PRIu64 " tensor infos (after %" PRIu64 " key/value pairs) cannot fit in the %" PRIu64
                    " remaining bytes",
                    n_tensors, n_kv, rem);
    g->n_kv = (int64_t)n_kv;
    g->n_tensors = (int64_t)n_tensors;
    g->alignment = RT_GGUF_DEFAULT_ALIGNMENT;

    g->kv = calloc(n_kv ? n_kv : 1, sizeof(*g->kv));
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof(*g->tensors));
    uint64_t *offset_pos = malloc((n_tensors ? n_tensors : 1) * sizeof(*offset_pos));
    if (!g->kv || !g->tensors || !offset_pos || index_init(&g->kv_index, n_kv) < 0 ||
        index_init(&g->tensor_index, n_tensors) < 0) {
        rc = -ENOMEM;
        goto out;
    }
    unsupported_types unsupported = {0};
    if ((rc = parse_kvs(ps)) < 0 || (rc = parse_tensor_infos(ps, offset_pos, &unsupported)) < 0)
        goto out;
    if (unsupported.n_tensors > 0) {
        rc = refuse_unsupported(ps, &unsupported);
        goto out;
    }
    rc = place_tensor_data(ps, offset_pos);
out:
    free(offset_pos);
    if (rc == -ENOMEM && ps->err && ps->err_len)
        snprintf(ps->err, ps->err_len, "out of memory indexing a GGUF file of %" PRIu64 " bytes", ps->size);
    return rc;
}

void rt_gguf_free(rt_gguf *g)
{
    if (!g)
        return;
    if (g->kv)
        for (int64_t i = 0; i < g->n_kv; i++)
            free(g->kv[i].str_offs);
    free(g->kv);
    free(g->kv_index.slots);
    free(g->tensors);
    free(g->tensor_index.slots);
    if (g->map)
        munmap(g->map, g->map_len);
    free(g);
}

static int open_parsed(const void *data, uint64_t size, void *map, size_t map_len, rt_gguf **out, char *err,
                       size_t err_len)
{
    rt_gguf *g = calloc(1, sizeof(*g));
    if (!g) {
        if (map)
            munmap(map, map_len);
        if (err && err_len)
            snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    g->base = data;
    g->size = size;
    g->map = map;
    g->map_len = map_len;
    parser ps = {.g = g, .p = data, .size = size, .err = err, .err_len = err_len};
    int rc = parse(&ps);
    if (rc < 0) {
        rt_gguf_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

int rt_gguf_open_mem(const void *data, size_t size, rt_gguf **out, char *err, size_t err_len)
{
    *out = NULL;
    if (!data && size > 0) {
        if (err && err_len)
            snprintf(err, err_len, "no buffer");
        return -EINVAL;
    }
    static const uint8_t empty[1];
    return open_parsed(data ? data : empty, size, NULL, 0, out, err, err_len);
}

int rt_gguf_open(const char *path, rt_gguf **out, char *err, size_t err_len)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd == -1) {
        int e = errno;
        if (err && err_len)
            snprintf(err, err_len, "%s: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    int rc;
    if (fstat(fd, &st) == -1) {
        rc = -errno;
        if (err && err_len)
            snprintf(err, err_len, "%s: %s", path, strerror(-rc));
        goto fail_fd;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = -EINVAL;
        if (err && err_len)
            snprintf(err, err_len, "%s: not a regular file", path);
        goto fail_fd;
    }
    if (st.st_size < GGUF_HEADER_BYTES) {
        rc = -EINVAL;
        if (err && err_len)
            snprintf(err, err_len,
                     "%s: magic at offset 0: file is %" PRIu64 " bytes, too short for a GGUF header", path,
                     (uint64_t)st.st_size);
        goto fail_fd;
    }
    size_t len = (size_t)st.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        rc = -errno;
        if (err && err_len)
            snprintf(err, err_len, "%s: mmap: %s", path, strerror(-rc));
        goto fail_fd;
    }
    close(fd); /* the mapping keeps the file open */
    char msg[512];
    rc = open_parsed(map, len, map, len, out, msg, sizeof(msg));
    if (rc < 0 && err && err_len)
        snprintf(err, err_len, "%s: %s", path, msg);
    return rc;
fail_fd:
    close(fd);
    return rc;
}

uint32_t rt_gguf_version(const rt_gguf *g)
{
    return g->version;
}

uint32_t rt_gguf_alignment(const rt_gguf *g)
{
    return g->alignment;
}

uint64_t rt_gguf_file_size(const rt_gguf *g)
{
    return g->size;
}

uint64_t rt_gguf_data_offset(const rt_gguf *g)
{
    return g->data_off;
}

/* ---- metadata getters ---- */

int64_t rt_gguf_n_kv(const rt_gguf *g)
{
    return g->n_kv;
}

int64_t rt_gguf_find_key(const rt_gguf *g, const char *key)
{
    if (!key)
        return -1;
    return index_find(&g->kv_index, g->kv, sizeof(*g->kv), key, strlen(key));
}

static const gguf_kv *kv_at(const rt_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_kv ? &g->kv[i] : NULL;
}

rt_gguf_str rt_gguf_key_name(const rt_gguf *g, int64_t i)
{
    const gguf_kv *kv = kv_at(g, i);
    return kv ? kv->key : (rt_gguf_str){NULL, 0};
}

rt_gguf_vtype rt_gguf_kv_type(const rt_gguf *g, int64_t i)
{
    const gguf_kv *kv = kv_at(g, i);
    return kv ? (rt_gguf_vtype)kv->type : GGUF_BAD_VTYPE;
}

rt_gguf_vtype rt_gguf_arr_type(const rt_gguf *g, int64_t i)
{
    const gguf_kv *kv = kv_at(g, i);
    return kv && kv->type == RT_GGUF_ARRAY ? (rt_gguf_vtype)kv->arr_type : GGUF_BAD_VTYPE;
}

uint64_t rt_gguf_arr_n(const rt_gguf *g, int64_t i)
{
    const gguf_kv *kv = kv_at(g, i);
    return kv && kv->type == RT_GGUF_ARRAY ? kv->arr_n : 0;
}

/* A decoded numeric value. */
typedef enum num_kind { NUM_SIGNED, NUM_UNSIGNED, NUM_FLOAT, NUM_BOOL } num_kind;
typedef struct num {
    num_kind kind;
    int64_t i;
    uint64_t u;
    double f;
} num;

static bool num_load(const uint8_t *p, uint32_t type, num *n)
{
    memset(n, 0, sizeof(*n));
    switch (type) {
    case RT_GGUF_UINT8:
        n->kind = NUM_UNSIGNED, n->u = p[0];
        return true;
    case RT_GGUF_UINT16:
        n->kind = NUM_UNSIGNED, n->u = le16(p);
        return true;
    case RT_GGUF_UINT32:
        n->kind = NUM_UNSIGNED, n->u = le32(p);
        return true;
    case RT_GGUF_UINT64:
        n->kind = NUM_UNSIGNED, n->u = le64(p);
        return true;
    case RT_GGUF_INT8:
        n->kind = NUM_SIGNED, n->i = (int8_t)p[0];
        return true;
    case RT_GGUF_INT16:
        n->kind = NUM_SIGNED, n->i = (int16_t)le16(p);
        return true;
    case RT_GGUF_INT32:
        n->kind = NUM_SIGNED, n->i = (int32_t)le32(p);
        return true;
    case RT_GGUF_INT64:
        n->kind = NUM_SIGNED, n->i = (int64_t)le64(p);
        return true;
    case RT_GGUF_BOOL:
        n->kind = NUM_BOOL, n->u = p[0] != 0;
        return true;
    case RT_GGUF_FLOAT32: {
        uint32_t b = le32(p);
        float f;
        memcpy(&f, &b, sizeof(f));
        n->kind = NUM_FLOAT, n->f = f;
        return true;
    }
    case RT_GGUF_FLOAT64: {
        uint64_t b = le64(p);
        memcpy(&n->f, &b, sizeof(n->f));
        n->kind = NUM_FLOAT;
        return true;
    }
    default:
        return false;
    }
}

/* Integer conversions of typed getters: integers only, no bool or float. */
static int num_to_u64(const num *n, uint64_t *out)
{
    if (n->kind == NUM_UNSIGNED)
        return *out = n->u, 0;
    if (n->kind == NUM_SIGNED && n->i >= 0)
        return *out = (uint64_t)n->i, 0;
    return -EINVAL;
}

static int num_to_i64(const num *n, int64_t *out)
{
    if (n->kind == NUM_SIGNED)
        return *out = n->i, 0;
    if (n->kind == NUM_UNSIGNED && n->u <= INT64_MAX)
        return *out = (int64_t)n->u, 0;
    return -EINVAL;
}

/* Any-scalar conversions (rt_gguf_kv_i64 and friends): bool is 0/1, a float
 * converts when it holds an integer in range. */
static int num_any_i64(const num *n, int64_t *out)
{
    if (n->kind == NUM_BOOL)
        return *out = (int64_t)n->u, 0;
    if (n->kind == NUM_FLOAT) {
        double f = n->f;
        if (!(f >= -0x1p63 && f < 0x1p63) || f != (double)(int64_t)f)
            return -EINVAL;
        return *out = (int64_t)f, 0;
    }
    return num_to_i64(n, out);
}

static double num_any_f64(const num *n)
{
    switch (n->kind) {
    case NUM_SIGNED:
        return (double)n->i;
    case NUM_FLOAT:
        return n->f;
    default:
        return (double)n->u;
    }
}

/* Loads the scalar value of key; -ENOENT if absent, -EINVAL if not a number. */
static int get_num(const rt_gguf *g, const char *key, num *n)
{
    int64_t i = rt_gguf_find_key(g, key);
    if (i < 0)
        return -ENOENT;
    return num_load(g->base + g->kv[i].off, g->kv[i].type, n) ? 0 : -EINVAL;
}

int rt_gguf_get_u32(const rt_gguf *g, const char *key, uint32_t *out)
{
    num n;
    uint64_t v;
    int rc = get_num(g, key, &n);
    if (rc < 0)
        return rc;
    if (num_to_u64(&n, &v) < 0 || v > UINT32_MAX)
        return -EINVAL;
    *out = (uint32_t)v;
    return 0;
}

int rt_gguf_get_u64(const rt_gguf *g, const char *key, uint64_t *out)
{
    num n;
    int rc = get_num(g, key, &n);
    return rc < 0 ? rc : num_to_u64(&n, out);
}

int rt_gguf_get_i64(const rt_gguf *g, const char *key, int64_t *out)
{
    num n;
    int rc = get_num(g, key, &n);
    return rc < 0 ? rc : num_to_i64(&n, out);
}

int rt_gguf_get_f32(const rt_gguf *g, const char *key, float *out)
{
    num n;
    int rc = get_num(g, key, &n);
    if (rc < 0)
        return rc;
    if (n.kind == NUM_BOOL)
        return -EINVAL;
    double f = num_any_f64(&n);
    /* Converting a finite double outside float's range is undefined. */
    if (isfinite(f) && (f > FLT_MAX || f < -FLT_MAX))
        return -EINVAL;
    *out = (float)f;
    return 0;
}

int rt_gguf_get_bool(const rt_gguf *g, const char *key, bool *out)
{
    num n;
    int rc = get_num(g, key, &n);
    if (rc < 0)
        return rc;
    if (n.kind != NUM_BOOL)
        return -EINVAL;
    *out = n.u != 0;
    return 0;
}

static rt_gguf_str str_at(const rt_gguf *g, uint64_t off)
{
    return (rt_gguf_str){(const char *)g->base + off + 8, le64(g->base + off)};
}

int rt_gguf_get_str(const rt_gguf *g, const char *key, rt_gguf_str *out)
{
    int64_t i = rt_gguf_find_key(g, key);
    if (i < 0)
        return -ENOENT;
    return rt_gguf_kv_str(g, i, out);
}

int rt_gguf_kv_i64(const rt_gguf *g, int64_t i, int64_t *out)
{
    const gguf_kv *kv = kv_at(g, i);
    num n;
    if (!kv || !num_load(g->base + kv->off, kv->type, &n))
        return -EINVAL;
    return num_any_i64(&n, out);
}

int rt_gguf_kv_f64(const rt_gguf *g, int64_t i, double *out)
{
    const gguf_kv *kv = kv_at(g, i);
    num n;
    if (!kv || !num_load(g->base + kv->off, kv->type, &n))
        return -EINVAL;
    *out = num_any_f64(&n);
    return 0;
}

int rt_gguf_kv_str(const rt_gguf *g, int64_t i, rt_gguf_str *out)
{
    const gguf_kv *kv = kv_at(g, i);
    if (!kv || kv->type != RT_GGUF_STRING)
        return -EINVAL;
    *out = str_at(g, kv->off);
    return 0;
}

/* Array kv i when it is an array with element j of a fixed-size type. */
static const uint8_t *arr_elem(const rt_gguf *g, int64_t i, uint64_t j, uint32_t *type)
{
    const gguf_kv *kv = kv_at(g, i);
    if (!kv || kv->type != RT_GGUF_ARRAY || j >= kv->arr_n || vtype_size(kv->arr_type) == 0)
        return NULL;
    *type = kv->arr_type;
    return g->base + kv->off + j * vtype_size(kv->arr_type);
}

int rt_gguf_arr_str(const rt_gguf *g, int64_t i, uint64_t j, rt_gguf_str *out)
{
    const gguf_kv *kv = kv_at(g, i);
    if (!kv || kv->type != RT_GGUF_ARRAY || kv->arr_type != RT_GGUF_STRING || j >= kv->arr_n)
        return -EINVAL;
    *out = str_at(g, kv->str_offs[j]);
    return 0;
}

int rt_gguf_arr_i64(const rt_gguf *g, int64_t i, uint64_t j, int64_t *out)
{
    uint32_t type;
    const uint8_t *p = arr_elem(g, i, j, &type);
    num n;
    if (!p || !num_load(p, type, &n))
        return -EINVAL;
    return num_any_i64(&n, out);
}

int rt_gguf_arr_f64(const rt_gguf *g, int64_t i, uint64_t j, double *out)
{
    uint32_t type;
    const uint8_t *p = arr_elem(g, i, j, &type);
    num n;
    if (!p || !num_load(p, type, &n))
        return -EINVAL;
    *out = num_any_f64(&n);
    return 0;
}

/* ---- tensors ---- */

int64_t rt_gguf_n_tensors(const rt_gguf *g)
{
    return g->n_tensors;
}

const rt_gguf_tensor *rt_gguf_tensor_at(const rt_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const rt_gguf_tensor *rt_gguf_find_tensor(const rt_gguf *g, const char *name)
{
    if (!name)
        return NULL;
    int64_t i = index_find(&g->tensor_index, g->tensors, sizeof(*g->tensors), name, strlen(name));
    return i >= 0 ? &g->tensors[i] : NULL;
}

bool rt_gguf_str_eq(rt_gguf_str s, const char *c)
{
    return str_eq_bytes(s, c, strlen(c));
}

/* ---- writer ---- */

typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
    bool oom;
} wbuf;

static void wb_put(wbuf *b, const void *src, size_t n)
{
    if (b->oom)
        return;
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void wb_le(wbuf *b, uint64_t v, size_t n)
{
    uint8_t tmp[8];
    for (size_t k = 0; k < n; k++)
        tmp[k] = (uint8_t)(v >> (8 * k));
    wb_put(b, tmp, n);
}

static void wb_str(wbuf *b, const char *s, size_t n)
{
    wb_le(b, n, 8);
    wb_put(b, s, n);
}

/* Encodes one fixed-size value from its C representation (bool as bool). */
static void wb_scalar(wbuf *b, uint32_t type, const void *v)
{
    size_t n = vtype_size(type);
    uint64_t u = 0;
    if (type == RT_GGUF_BOOL) {
        bool x;
        memcpy(&x, v, sizeof(x));
        u = x;
    } else if (n == 1) {
        uint8_t x;
        memcpy(&x, v, 1);
        u = x;
    } else if (n == 2) {
        uint16_t x;
        memcpy(&x, v, 2);
        u = x;
    } else if (n == 4) {
        uint32_t x;
        memcpy(&x, v, 4);
        u = x;
    } else {
        memcpy(&u, v, 8);
    }
    wb_le(b, u, n);
}

typedef struct wkv {
    char *key;
    uint32_t type;
    uint8_t *val; /* encoded value, without the type */
    size_t val_len;
} wkv;

typedef struct wtensor {
    char *name;
    uint32_t type, n_dims;
    int64_t ne[RT_GGUF_MAX_DIMS];
    const void *data;
    uint64_t nbytes;
} wtensor;

struct rt_gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
};

rt_gguf_writer *rt_gguf_writer_new(void)
{
    return calloc(1, sizeof(rt_gguf_writer));
}

void rt_gguf_writer_free(rt_gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++)
        free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w);
}

static bool grow(void **p, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return true;
    size_t c = *cap ? *cap * 2 : 16;
    void *q = realloc(*p, c * elem);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

/* Takes the encoded value in b. A key added again replaces its value, as
 * ggml's gguf_set_* does, so the file never holds a duplicate. */
static int add_kv(rt_gguf_writer *w, const char *key, uint32_t type, wbuf *b)
{
    if (b->oom) {
        free(b->p);
        return -ENOMEM;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, key) == 0) {
            free(w->kv[i].val);
            w->kv[i].type = type;
            w->kv[i].val = b->p;
            w->kv[i].val_len = b->n;
            return 0;
        }
    }
    char *k = strdup(key);
    if (!k || !grow((void **)&w->kv, &w->cap_kv, w->n_kv, sizeof(*w->kv))) {
        free(k);
        free(b->p);
        return -ENOMEM;
    }
    w->kv[w->n_kv++] = (wkv){.key = k, .type = type, .val = b->p, .val_len = b->n};
    return 0;
}

int rt_gguf_writer_add_scalar(rt_gguf_writer *w, const char *key, rt_gguf_vtype type, const void *v)
{
    if (!w || !key || !v || vtype_size(type) == 0)
        return -EINVAL;
    wbuf b = {0};
    wb_scalar(&b, type, v);
    return add_kv(w, key, type, &b);
}

int rt_gguf_writer_add_arr(rt_gguf_writer *w, const char *key, rt_gguf_vtype elem_type, const void *v,
                           uint64_t n)
{
    size_t es = vtype_size(elem_type);
    if (!w || !key || (!v && n > 0) || es == 0 || n > SIZE_MAX / es)
        return -EINVAL;
    wbuf b = {0};
    wb_le(&b, elem_type, 4);
    wb_le(&b, n, 8);
    for (uint64_t j = 0; j < n; j++)
        wb_scalar(&b, elem_type, (const uint8_t *)v + j * es);
    return add_kv(w, key, RT_GGUF_ARRAY, &b);
}

int rt_gguf_writer_add_u32(rt_gguf_writer *w, const char *key, uint32_t v)
{
    return rt_gguf_writer_add_scalar(w, key, RT_GGUF_UINT32, &v);
}

int rt_gguf_writer_add_i32(rt_gguf_writer *w, const char *key, int32_t v)
{
    return rt_gguf_writer_add_scalar(w, key, RT_GGUF_INT32, &v);
}

int rt_gguf_writer_add_u64(rt_gguf_writer *w, const char *key, uint64_t v)
{
    return rt_gguf_writer_add_scalar(w, key, RT_GGUF_UINT64, &v);
}

int rt_gguf_writer_add_f32(rt_gguf_writer *w, const char *key, float v)
{
    return rt_gguf_writer_add_scalar(w, key, RT_GGUF_FLOAT32, &v);
}

int rt_gguf_writer_add_bool(rt_gguf_writer *w, const char *key, bool v)
{
    return rt_gguf_writer_add_scalar(w, key, RT_GGUF_BOOL, &v);
}

int rt_gguf_writer_add_str(rt_gguf_writer *w, const char *key, const char *v)
{
    if (!w || !key || !v)
        return -EINVAL;
    wbuf b = {0};
    wb_str(&b, v, strlen(v));
    return add_kv(w, key, RT_GGUF_STRING, &b);
}

int rt_gguf_writer_add_arr_str(rt_gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
    if (!w || !key || (!v && n > 0))
        return -EINVAL;
    wbuf b = {0};
    wb_le(&b, RT_GGUF_STRING, 4);
    wb_le(&b, n, 8);
    for (uint64_t j = 0; j < n; j++) {
        if (!v[j]) {
            free(b.p);
            return -EINVAL;
        }
        wb_str(&b, v[j], strlen(v[j]));
    }
    return add_kv(w, key, RT_GGUF_ARRAY, &b);
}

int rt_gguf_writer_add_arr_f32(rt_gguf_writer *w, const char *key, const float *v, uint64_t n)
{
    return rt_gguf_writer_add_arr(w, key, RT_GGUF_FLOAT32, v, n);
}

int rt_gguf_writer_add_arr_i32(rt_gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
    return rt_gguf_writer_add_arr(w, key, RT_GGUF_INT32, v, n);
}

int rt_gguf_writer_copy_kv(rt_gguf_writer *w, const rt_gguf *g, int64_t i)
{
    const gguf_kv *kv = kv_at(g, i);
    if (!w || !kv || memchr(kv->key.p, '\0', kv->key.n))
        return -EINVAL;
    /* An array's value starts at its element type and count. */
    uint64_t start = kv->type == RT_GGUF_ARRAY ? kv->off - 12 : kv->off;
    wbuf b = {0};
    wb_put(&b, g->base + start, kv->end - start);
    char *key = strndup(kv->key.p, kv->key.n);
    if (!key) {
        free(b.p);
        return -ENOMEM;
    }
    int rc = add_kv(w, key, kv->type, &b);
    free(key);
    return rc;
}

int rt_gguf_writer_add_tensor(rt_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                              const int64_t *ne, const void *data, uint64_t nbytes)
{
    if (!w || !name || !ne || !kn_type_supported(type) || n_dims < 1 || n_dims > RT_GGUF_MAX_DIMS)
        return -EINVAL;
    wtensor t = {.type = type, .n_dims = n_dims, .data = data, .nbytes = nbytes};
    uint64_t nelem = 1;
    for (uint32_t j = 0; j < RT_GGUF_MAX_DIMS; j++) {
        t.ne[j] = j < n_dims ? ne[j] : 1;
        if (t.ne[j] < 0)
            return -EINVAL;
        if (t.ne[j] > 0 && nelem > (uint64_t)INT64_MAX / (uint64_t)t.ne[j])
            return -EINVAL;
        nelem *= (uint64_t)t.ne[j];
    }
    uint64_t blk = (uint64_t)kn_type_block_elems(type), bb = kn_type_block_bytes(type);
    if ((uint64_t)t.ne[0] % blk != 0 || nelem / blk > UINT64_MAX / bb || nelem / blk * bb != nbytes ||
        (!data && nbytes))
        return -EINVAL;
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return -EINVAL;
    if (!(t.name = strdup(name)) || !grow((void **)&w->t, &w->cap_t, w->n_t, sizeof(*w->t))) {
        free(t.name);
        return -ENOMEM;
    }
    w->t[w->n_t++] = t;
    return 0;
}

/* Fills err and returns code. */
static int werr(char *err, size_t err_len, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int werr(char *err, size_t err_len, int code, const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return code;
}

static int writer_alignment(const rt_gguf_writer *w, uint32_t *align, char *err, size_t err_len)
{
    *align = RT_GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, "general.alignment") != 0)
            continue;
        if (w->kv[i].type != RT_GGUF_UINT32)
            return werr(err, err_len, -EINVAL, "general.alignment must be of type u32, found %s",
                        vtype_name(w->kv[i].type));
        uint32_t a = le32(w->kv[i].val);
        if (a == 0 || (a & (a - 1)) != 0)
            return werr(err, err_len, -EINVAL, "general.alignment %" PRIu32 " is not a power of two", a);
        *align = a;
    }
    return 0;
}

static int put(FILE *f, const void *p, size_t n)
{
    if (n == 0 || fwrite(p, 1, n, f) == n)
        return 0;
    return errno ? -errno : -EIO;
}

static int put_le(FILE *f, uint64_t v, size_t n)
{
    uint8_t tmp[8];
    for (size_t k = 0; k < n; k++)
        tmp[k] = (uint8_t)(v >> (8 * k));
    return put(f, tmp, n);
}

static int put_zeros(FILE *f, uint64_t n)
{
    static const uint8_t zeros[256];
    int rc = 0;
    while (n > 0 && rc == 0) {
        size_t k = n < sizeof(zeros) ? (size_t)n : sizeof(zeros);
        rc = put(f, zeros, k);
        n -= k;
    }
    return rc;
}

static uint64_t pad_to(uint64_t n, uint64_t a)
{
    return (a - n % a) % a;
}

static int write_stream(const rt_gguf_writer *w, FILE *f, char *err, size_t err_len)
{
    uint32_t align;
    int rc = writer_alignment(w, &align, err, err_len);
    if (rc < 0)
        return rc;
    errno = 0;
    uint64_t pos = 0;
    rc = put(f, GGUF_MAGIC, 4);
    if (!rc)
        rc = put_le(f, 3, 4);
    if (!rc)
        rc = put_le(f, w->n_t, 8);
    if (!rc)
        rc = put_le(f, w->n_kv, 8);
    pos = GGUF_HEADER_BYTES;
    for (size_t i = 0; i < w->n_kv && !rc; i++) {
        const wkv *kv = &w->kv[i];
        size_t kn = strlen(kv->key);
        rc = put_le(f, kn, 8);
        if (!rc)
            rc = put(f, kv->key, kn);
        if (!rc)
            rc = put_le(f, kv->type, 4);
        if (!rc)
            rc = put(f, kv->val, kv->val_len);
        pos += 8 + kn + 4 + kv->val_len;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t && !rc; i++) {
        const wtensor *t = &w->t[i];
        size_t nn = strlen(t->name);
        rc = put_le(f, nn, 8);
        if (!rc)
            rc = put(f, t->name, nn);
        if (!rc)
            rc = put_le(f, t->n_dims, 4);
        for (uint32_t j = 0; j < t->n_dims && !rc; j++)
            rc = put_le(f, (uint64_t)t->ne[j], 8);
        if (!rc)
            rc = put_le(f, t->type, 4);
        if (!rc)
            rc = put_le(f, off, 8);
        pos += 8 + nn + 4 + 8 * (uint64_t)t->n_dims + 4 + 8;
        uint64_t padded = t->nbytes + pad_to(t->nbytes, align);
        if (padded < t->nbytes || off > UINT64_MAX - padded)
            return werr(err, err_len, -EINVAL, "tensor data of %zu tensors overflows 64-bit offsets", w->n_t);
        off += padded;
    }
    if (!rc)
        rc = put_zeros(f, pad_to(pos, align));
    for (size_t i = 0; i < w->n_t && !rc; i++) {
        rc = put(f, w->t[i].data, w->t[i].nbytes);
        if (!rc)
            rc = put_zeros(f, pad_to(w->t[i].nbytes, align));
    }
    if (!rc && fflush(f) == EOF)
        rc = errno ? -errno : -EIO;
    if (rc < 0)
        return werr(err, err_len, rc, "write: %s", strerror(-rc));
    return 0;
}

int rt_gguf_writer_write(rt_gguf_writer *w, const char *path, char *err, size_t err_len)
{
    if (!w || !path)
        return werr(err, err_len, -EINVAL, "no writer or path");
    size_t plen = strlen(path);
    char *tmp = malloc(plen + sizeof(".tmp.XXXXXX"));
    if (!tmp)
        return werr(err, err_len, -ENOMEM, "out of memory");
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp.XXXXXX", sizeof(".tmp.XXXXXX"));
    int rc;
    int fd = mkstemp(tmp);
    if (fd == -1) {
        rc = -errno;
        werr(err, err_len, rc, "%s: %s", tmp, strerror(-rc));
        goto fail_tmp;
    }
    /* mkstemp creates 0600; a model file is meant to be shared. */
    if (fchmod(fd, 0644) == -1) {
        rc = -errno;
        werr(err, err_len, rc, "%s: chmod: %s", tmp, strerror(-rc));
        close(fd);
        goto fail_unlink;
    }
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        rc = -errno;
        werr(err, err_len, rc, "%s: %s", tmp, strerror(-rc));
        close(fd);
        goto fail_unlink;
    }
    char msg[256] = "";
    rc = write_stream(w, f, msg, sizeof(msg));
    if (rc == 0 && fsync(fileno(f)) == -1)
        rc = -errno, snprintf(msg, sizeof(msg), "fsync: %s", strerror(-rc));
    if (fclose(f) == EOF && rc == 0)
        rc = -errno, snprintf(msg, sizeof(msg), "close: %s", strerror(-rc));
    if (rc < 0) {
        werr(err, err_len, rc, "%s: %s", path, msg);
        goto fail_unlink;
    }
    if (rename(tmp, path) == -1) {
        rc = -errno;
        werr(err, err_len, rc, "rename %s to %s: %s", tmp, path, strerror(-rc));
        goto fail_unlink;
    }
    free(tmp);
    return 0;
fail_unlink:
    unlink(tmp);
fail_tmp:
    free(tmp);
    return rc;
}

int rt_gguf_writer_write_mem(rt_gguf_writer *w, void **out, size_t *out_len, char *err, size_t err_len)
{
    *out = NULL;
    *out_len = 0;
    if (!w)
        return werr(err, err_len, -EINVAL, "no writer");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return werr(err, err_len, -ENOMEM, "open_memstream: %s", strerror(errno));
    int rc = write_stream(w, f, err, err_len);
    if (fclose(f) == EOF && rc == 0)
        rc = werr(err, err_len, -ENOMEM, "open_memstream: out of memory");
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    *out_len = len;
    return 0;
}
