/* The hash of the runtime's name tables (GGUF keys and tensor names, the
 * tokenizer's vocabulary): FNV-1a from a per-process random basis, then
 * a 64-bit finaliser with the same key. Both tables place names by open
 * addressing: with a fixed hash a model file could carry names chosen
 * offline to fall into one run of slots, and loading it took time growing
 * with the square of their count (60k such keys: 4.5 s; 15 MB of them: on
 * the order of minutes). With an unknown key the slots cannot be aimed at. */
#ifndef RT_HASH_H
#define RT_HASH_H

#include <stddef.h>
#include <stdint.h>

/* The process's key, drawn once (getrandom) on first use. */
uint64_t rt_hash_key(void);

static inline uint64_t rt_hash_bytes(const char *p, size_t n, uint64_t key)
{
    uint64_t h = 0xcbf29ce484222325ULL ^ key;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)p[i];
        h *= 0x100000001b3ULL;
    }
    h ^= key;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

#endif
