/* Small-object allocator for the request path: per-thread free lists by
 * size class in front of malloc. A proxy keeps a few hundred requests in
 * flight, each with a dozen small allocations (its stream, nghttp2's
 * frames and header buffers, the upstream request) made and freed in
 * bursts; glibc's per-thread cache holds 7 blocks per size and sends the
 * rest through its slow paths. Here each class keeps up to
 * GW_MEM_CLASS_KEEP free blocks; larger blocks go straight to malloc.
 *
 * Blocks carry a header: what gw_mem_* returns is freed with gw_mem_free
 * only (on any thread; it joins that thread's lists). Under
 * AddressSanitizer every call goes to malloc and free, so that reuse does
 * not hide a use after free. */
#ifndef GW_MEM_H
#define GW_MEM_H

#include <stddef.h>

#define GW_MEM_CLASS_KEEP 512 /* free blocks kept per size class and thread */

void *gw_mem_alloc(size_t n);
void *gw_mem_calloc(size_t n, size_t size);
/* As realloc: NULL p allocates, and on failure p is left as it was. */
void *gw_mem_realloc(void *p, size_t n);
void gw_mem_free(void *p);

/* nghttp2's allocator vtable (nghttp2_mem) backed by the calls above, for
 * nghttp2_session_*_new3. Typed void * so that this header needs no
 * nghttp2 include. */
void *gw_mem_nghttp2(void);

#endif
