/* GGUF v2/v3 reader (memory-mapped, strictly validated) and writer.
 *
 * File layout (little endian):
 *   magic "GGUF" u32 | version u32 | n_tensors u64 | n_kv u64
 *   n_kv x { key: string, value_type u32, value }
 *   n_tensors x { name: string, n_dims u32, ne[n_dims] u64, type u32, offset u64 }
 *   padding to `general.alignment` (default 32)
 *   tensor data; each tensor at data_start + offset, offset aligned
 * string = u64 length + bytes (no NUL). array = elem_type u32 + n u64 + elems.
 *
 * The reader never trusts a length or offset: every one is checked against
 * the file size before use, and a rejection names the field and its byte
 * offset in `err`. Strings and arrays point into the mapping (no NUL; use the
 * length). */
#ifndef RT_GGUF_H
#define RT_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum rt_gguf_vtype {
    RT_GGUF_UINT8 = 0,
    RT_GGUF_INT8 = 1,
    RT_GGUF_UINT16 = 2,
    RT_GGUF_INT16 = 3,
    RT_GGUF_UINT32 = 4,
    RT_GGUF_INT32 = 5,
    RT_GGUF_FLOAT32 = 6,
    RT_GGUF_BOOL = 7,
    RT_GGUF_STRING = 8,
    RT_GGUF_ARRAY = 9,
    RT_GGUF_UINT64 = 10,
    RT_GGUF_INT64 = 11,
    RT_GGUF_FLOAT64 = 12,
} rt_gguf_vtype;

#define RT_GGUF_MAX_DIMS 4
#define RT_GGUF_DEFAULT_ALIGNMENT 32

typedef struct rt_gguf rt_gguf;

typedef struct rt_gguf_str {
    const char *p; /* not NUL-terminated */
    uint64_t n;
} rt_gguf_str;

typedef struct rt_gguf_tensor {
    rt_gguf_str name;
    uint32_t type; /* kn_type */
    uint32_t n_dims;
    int64_t ne[RT_GGUF_MAX_DIMS]; /* ne[0] is the row length; unused dims are 1 */
    uint64_t offset;              /* relative to the data section */
    uint64_t nbytes;
    const void *data; /* into the mapping */
} rt_gguf_tensor;

/* Error codes: -EINVAL bad file (err says which field at which offset),
 * -ENOMEM, -errno from open/mmap. */
int rt_gguf_open(const char *path, rt_gguf **out, char *err, size_t err_len);
/* Parses a buffer the caller keeps alive for the life of the result. */
int rt_gguf_open_mem(const void *data, size_t size, rt_gguf **out, char *err, size_t err_len);
void rt_gguf_free(rt_gguf *g);

uint32_t rt_gguf_version(const rt_gguf *g);
uint32_t rt_gguf_alignment(const rt_gguf *g);
uint64_t rt_gguf_file_size(const rt_gguf *g);
uint64_t rt_gguf_data_offset(const rt_gguf *g); /* where tensor data starts */

/* ---- metadata ---- */
int64_t rt_gguf_n_kv(const rt_gguf *g);
/* Index of key, or -1. */
int64_t rt_gguf_find_key(const rt_gguf *g, const char *key);
rt_gguf_str rt_gguf_key_name(const rt_gguf *g, int64_t i);
rt_gguf_vtype rt_gguf_kv_type(const rt_gguf *g, int64_t i);
/* For arrays: element type and count. */
rt_gguf_vtype rt_gguf_arr_type(const rt_gguf *g, int64_t i);
uint64_t rt_gguf_arr_n(const rt_gguf *g, int64_t i);

/* Typed lookups by key. Return 0, -ENOENT (absent) or -EINVAL (present with
 * a type that does not convert). Integers convert between widths when the
 * value fits; floats accept any float or integer type. */
int rt_gguf_get_u32(const rt_gguf *g, const char *key, uint32_t *out);
int rt_gguf_get_u64(const rt_gguf *g, const char *key, uint64_t *out);
int rt_gguf_get_i64(const rt_gguf *g, const char *key, int64_t *out);
int rt_gguf_get_f32(const rt_gguf *g, const char *key, float *out);
int rt_gguf_get_bool(const rt_gguf *g, const char *key, bool *out);
int rt_gguf_get_str(const rt_gguf *g, const char *key, rt_gguf_str *out);

/* Value of kv i as a scalar of any numeric type (bool counts as 0/1). */
int rt_gguf_kv_i64(const rt_gguf *g, int64_t i, int64_t *out);
int rt_gguf_kv_f64(const rt_gguf *g, int64_t i, double *out);
int rt_gguf_kv_str(const rt_gguf *g, int64_t i, rt_gguf_str *out);
/* Element j of array kv i. Out of range or wrong type: -EINVAL. */
int rt_gguf_arr_str(const rt_gguf *g, int64_t i, uint64_t j, rt_gguf_str *out);
int rt_gguf_arr_i64(const rt_gguf *g, int64_t i, uint64_t j, int64_t *out);
int rt_gguf_arr_f64(const rt_gguf *g, int64_t i, uint64_t j, double *out);

/* ---- tensors ---- */
int64_t rt_gguf_n_tensors(const rt_gguf *g);
const rt_gguf_tensor *rt_gguf_tensor_at(const rt_gguf *g, int64_t i);
const rt_gguf_tensor *rt_gguf_find_tensor(const rt_gguf *g, const char *name);

/* Compares a GGUF string with a C string. */
bool rt_gguf_str_eq(rt_gguf_str s, const char *c);

/* ---- writer ----
 * Collects metadata and tensors, then writes a GGUF v3 file. Tensor data is
 * referenced, not copied: it must stay alive until rt_gguf_writer_write. */
typedef struct rt_gguf_writer rt_gguf_writer;

rt_gguf_writer *rt_gguf_writer_new(void);
void rt_gguf_writer_free(rt_gguf_writer *w);
/* Each add returns 0, -ENOMEM, or -EINVAL for a bad argument (NULL key, a
 * non-fixed-size type, nbytes that do not match the shape, a duplicate
 * tensor name). */
/* Copies a string from the file into dst (cap >= 8) for a message or a
 * terminal: hostile names may hold control bytes (escape sequences) or be
 * megabytes long. Bytes outside printable ASCII and '"' become '?', and a
 * long one ends "...". Returns dst. */
const char *rt_gguf_printable(char *dst, size_t cap, rt_gguf_str s);

int rt_gguf_writer_add_u32(rt_gguf_writer *w, const char *key, uint32_t v);
int rt_gguf_writer_add_i32(rt_gguf_writer *w, const char *key, int32_t v);
int rt_gguf_writer_add_u64(rt_gguf_writer *w, const char *key, uint64_t v);
int rt_gguf_writer_add_f32(rt_gguf_writer *w, const char *key, float v);
int rt_gguf_writer_add_bool(rt_gguf_writer *w, const char *key, bool v);
int rt_gguf_writer_add_str(rt_gguf_writer *w, const char *key, const char *v);
int rt_gguf_writer_add_arr_str(rt_gguf_writer *w, const char *key, const char *const *v, uint64_t n);
int rt_gguf_writer_add_arr_f32(rt_gguf_writer *w, const char *key, const float *v, uint64_t n);
int rt_gguf_writer_add_arr_i32(rt_gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
/* Copies key/value pair i of g as it is (any type, arrays of strings and
 * nested arrays too), replacing a value of the same key. */
int rt_gguf_writer_copy_kv(rt_gguf_writer *w, const rt_gguf *g, int64_t i);
/* ne[0] is the row length; type is a kn_type. */
int rt_gguf_writer_add_tensor(rt_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                              const int64_t *ne, const void *data, uint64_t nbytes);
/* Writes to path (via a temporary file and rename). 0 or -errno. */
int rt_gguf_writer_write(rt_gguf_writer *w, const char *path, char *err, size_t err_len);

/* Additions for tests and tools. Invalid arguments (a NULL key, a type that
 * is not fixed-size, a tensor whose nbytes does not match its shape, a
 * duplicate tensor name) make any add return -EINVAL. */
/* One scalar of any fixed-size type; v points to its C representation
 * (uint8_t..double, bool as bool). */
int rt_gguf_writer_add_scalar(rt_gguf_writer *w, const char *key, rt_gguf_vtype type, const void *v);
/* An array of n fixed-size elements of elem_type (strings: add_arr_str). */
int rt_gguf_writer_add_arr(rt_gguf_writer *w, const char *key, rt_gguf_vtype elem_type, const void *v,
                           uint64_t n);
/* Writes the file into a malloc'ed buffer the caller frees. 0, -ENOMEM or
 * -EINVAL (bad general.alignment). */
int rt_gguf_writer_write_mem(rt_gguf_writer *w, void **out, size_t *out_len, char *err, size_t err_len);

#endif
