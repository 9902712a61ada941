/* Markers in a model's streamed text: what the tool-call, reasoning and
 * harmony parsers share to find a marker, hold back the start of one a
 * piece boundary cut, and collect what a feed lets out.
 *
 * Threads: pure, except that a buffer is its owner's. */
#ifndef RT_MARKERS_H
#define RT_MARKERS_H

#include <stdbool.h>
#include <stddef.h>

/* Where needle occurs in s[0..n) (its last place when last, else its
 * first), or -1. */
long rt_mk_find(const char *s, size_t n, const char *needle, bool last);
/* How much of s[0..n)'s end could be the start of marker m (shorter than
 * m: a whole one is found, not held). */
size_t rt_mk_partial(const char *s, size_t n, const char *m);
bool rt_mk_is_ws(char c);

/* A growing byte buffer, kept NUL-terminated once it holds anything. */
typedef struct rt_mk_buf {
    char *p;
    size_t len, cap;
} rt_mk_buf;

/* Room for need bytes in *b (capacity *cap, doubled as it grows); false
 * when out of memory (*b unchanged). */
bool rt_mk_grow(char **b, size_t *cap, size_t need);
/* Appends s[0..n); false when out of memory (b unchanged). */
bool rt_mk_put(rt_mk_buf *b, const char *s, size_t n);

#endif
