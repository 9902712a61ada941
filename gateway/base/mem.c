/* Small-object allocator (see mem.h): a 16-byte header in front of each
 * block names its size class (or none, for blocks malloc'd to size), and
 * the free blocks of a class form a singly linked list through their first
 * bytes. */
#include "gateway/base/mem.h"

#include <nghttp2/nghttp2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define GW_MEM_PASSTHROUGH 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GW_MEM_PASSTHROUGH 1
#endif
#endif

#ifdef GW_MEM_PASSTHROUGH

void *gw_mem_alloc(size_t n)
{
    return malloc(n);
}

void *gw_mem_calloc(size_t n, size_t size)
{
    return calloc(n, size);
}

void *gw_mem_realloc(void *p, size_t n)
{
    return realloc(p, n);
}

void gw_mem_free(void *p)
{
    free(p);
}

#else

#define GRAIN 32     /* class c holds blocks of (c + 1) * GRAIN bytes */
#define N_CLASSES 32 /* up to 1 KiB; larger blocks are malloc'd to size */
#define NO_CLASS SIZE_MAX

/* 16 bytes keep the payload as aligned as malloc's. */
typedef struct hdr {
    size_t cls;  /* size class, or NO_CLASS */
    size_t size; /* bytes the payload can hold */
} hdr;

_Static_assert(sizeof(hdr) == 16, "the header keeps malloc's alignment");

typedef struct free_list {
    hdr *head; /* the next one is stored in the payload */
    size_t n;
} free_list;

static _Thread_local free_list lists[N_CLASSES];

void *gw_mem_alloc(size_t n)
{
    size_t c = n ? (n - 1) / GRAIN : 0;
    hdr *h;
    if (c < N_CLASSES) {
        free_list *l = &lists[c];
        if ((h = l->head)) {
            memcpy(&l->head, h + 1, sizeof(l->head));
            l->n--;
            return h + 1;
        }
        if (!(h = malloc(sizeof(hdr) + (c + 1) * GRAIN)))
            return NULL;
        *h = (hdr){c, (c + 1) * GRAIN};
        return h + 1;
    }
    if (n > SIZE_MAX - sizeof(hdr) || !(h = malloc(sizeof(hdr) + n)))
        return NULL;
    *h = (hdr){NO_CLASS, n};
    return h + 1;
}

void *gw_mem_calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    void *p = gw_mem_alloc(n * size);
    if (p)
        memset(p, 0, n * size);
    return p;
}

void *gw_mem_realloc(void *p, size_t n)
{
    if (!p)
        return gw_mem_alloc(n);
    const hdr *h = (const hdr *)p - 1;
    if (n <= h->size)
        return p;
    void *q = gw_mem_alloc(n);
    if (!q)
        return NULL;
    memcpy(q, p, h->size);
    gw_mem_free(p);
    return q;
}

void gw_mem_free(void *p)
{
    if (!p)
        return;
    hdr *h = (hdr *)p - 1;
    if (h->cls < N_CLASSES) {
        free_list *l = &lists[h->cls];
        if (l->n < GW_MEM_CLASS_KEEP) {
            memcpy(p, &l->head, sizeof(l->head));
            l->head = h;
            l->n++;
            return;
        }
    }
    free(h);
}

#endif

static void *ng_malloc(size_t size, void *ud)
{
    return gw_mem_alloc(size);
}

static void ng_free(void *ptr, void *ud)
{
    gw_mem_free(ptr);
}

static void *ng_calloc(size_t nmemb, size_t size, void *ud)
{
    return gw_mem_calloc(nmemb, size);
}

static void *ng_realloc(void *ptr, size_t size, void *ud)
{
    return gw_mem_realloc(ptr, size);
}

static nghttp2_mem ng_mem = {NULL, ng_malloc, ng_free, ng_calloc, ng_realloc};

void *gw_mem_nghttp2(void)
{
    return &ng_mem;
}
