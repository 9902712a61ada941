/* The vocabulary as a byte trie for grammar masks (see grammar.h): token
 * texts sorted, then laid out depth first so that a rejected prefix is
 * skipped with one jump. */
#include "runtime/grammar/internal.h"
#include "runtime/tokenizer.h"

#include <stdlib.h>
#include <string.h>

static const rt_gvocab *g_sort_vocab; /* qsort has no context argument */

static int by_text(const void *a, const void *b)
{
    const rt_gvocab *v = g_sort_vocab;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t n = v->len[x] < v->len[y] ? v->len[x] : v->len[y];
    int r = memcmp(v->text[x], v->text[y], n);
    if (r)
        return r;
    return v->len[x] < v->len[y] ? -1 : v->len[x] > v->len[y] ? 1 : x < y ? -1 : 1;
}

static pthread_mutex_t g_sort_mu = PTHREAD_MUTEX_INITIALIZER;

/* Builds the flat trie from the token ids sorted by text. */
static int build(rt_gvocab *v, int32_t *sorted, int32_t n)
{
    /* nodes: at most the sum of the texts' lengths */
    size_t total = 0;
    for (int32_t i = 0; i < n; i++)
        total += v->len[sorted[i]];
    if (total >= UINT32_MAX)
        return -1;
    v->nodes = calloc(total + 1, sizeof(vnode));
    if (!v->nodes)
        return -1;
    uint32_t path[65536 / 64]; /* node index at each depth of the current path */
    uint32_t depth = 0, count = 0;
    const char *prev = "";
    uint32_t prev_len = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t t = sorted[i];
        const char *s = v->text[t];
        uint32_t len = v->len[t];
        if (len > 1000)
            len = 1000; /* a longer token can never fit a grammar's step anyway */
        uint32_t common = 0;
        while (common < len && common < prev_len && common < depth && s[common] == prev[common])
            common++;
        /* close the nodes past the common prefix */
        while (depth > common)
            v->nodes[path[--depth]].end = count;
        while (depth < len) {
            vnode *nd = &v->nodes[count];
            nd->byte = (uint8_t)s[depth];
            nd->depth = (uint16_t)(depth + 1);
            path[depth++] = count++;
            if (depth > v->max_depth)
                v->max_depth = (uint16_t)depth;
        }
        vnode *at = &v->nodes[path[len - 1]];
        if (at->n_tok == 0)
            at->tok_first = (uint32_t)i;
        at->n_tok++;
        prev = s;
        prev_len = len;
    }
    while (depth > 0)
        v->nodes[path[--depth]].end = count;
    v->n_nodes = count;
    v->toks = sorted;
    return 0;
}

rt_gvocab *rt_gvocab_new(const rt_tokenizer *tok)
{
    rt_gvocab *v = calloc(1, sizeof(*v));
    int32_t n = rt_tokenizer_n_vocab(tok);
    if (!v)
        return NULL;
    v->n_vocab = n;
    v->text = calloc((size_t)n, sizeof(char *));
    v->len = calloc((size_t)n, sizeof(uint32_t));
    v->eog = calloc((size_t)n, sizeof(int32_t));
    int32_t *sorted = calloc((size_t)n, sizeof(int32_t));
    if (!v->text || !v->len || !v->eog || !sorted)
        goto fail;
    int32_t k = 0;
    for (int32_t t = 0; t < n; t++) {
        size_t len = 0;
        const char *p = rt_tokenizer_piece(tok, t, &len);
        if (rt_tokenizer_is_eog(tok, t))
            v->eog[v->n_eog++] = t;
        else if (p && len > 0) {
            v->text[t] = p;
            v->len[t] = (uint32_t)len;
            sorted[k++] = t;
        }
    }
    pthread_mutex_lock(&g_sort_mu);
    g_sort_vocab = v;
    qsort(sorted, (size_t)k, sizeof(int32_t), by_text);
    pthread_mutex_unlock(&g_sort_mu);
    if (build(v, sorted, k))
        goto fail;
    return v;
fail:
    free(sorted);
    rt_gvocab_free(v);
    return NULL;
}

void rt_gvocab_free(rt_gvocab *v)
{
    if (!v)
        return;
    free(v->nodes);
    if (v->nodes)
        free(v->toks);
    free(v->text);
    free(v->len);
    free(v->eog);
    free(v);
}

int32_t rt_gvocab_n(const rt_gvocab *v)
{
    return v->n_vocab;
}
