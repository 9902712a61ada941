/* The grammar matcher (see grammar.h): sets of parse stacks advanced a
 * byte at a time, and the allowed-token mask from each position's cached
 * split of the vocabulary (accepted / uncertain), the uncertain tokens
 * tried against the real stacks.
 *
 * A stack is a chain of nodes (position, parent), shared: a node's
 * position is a byte set to match, a parent's the element to go on with
 * once the rule below returns. Expanding a rule reference whose
 * continuation is the end of its alternative pushes nothing (a tail
 * call). The matcher's own nodes are interned, so equal states are equal
 * pointers and a state's mask can be reused. */
#include "runtime/grammar/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STACKS 128   /* a state of more stacks is an ambiguous grammar: refused */
#define MAX_EXPAND 2048  /* nested expansions for one byte */
#define N_CACHED 4       /* masks of recent states a matcher keeps */

typedef struct gnode gnode;
struct gnode {
    uint32_t pos;
    gnode *parent;
    gnode *hnext; /* intern table chain */
};

/* Markers in a set: the grammar is complete (ACCEPT), or a position's
 * own rule returned to the sentinel below it (SENT, in a precompute). */
static gnode k_accept, k_sent;
#define ACCEPT (&k_accept)
#define SENT (&k_sent)

typedef struct gset {
    gnode *v[MAX_STACKS];
    int n;
    bool overflow;
} gset;

/* Nodes allocated in chunks, freed together. */
typedef struct npool {
    gnode *chunk;
    size_t used, cap;
    gnode **chunks;
    size_t n_chunks, cap_chunks;
} npool;

static gnode *pool_node(npool *p)
{
    if (p->used == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        if (cap > 65536)
            cap = 65536;
        gnode *c = malloc(cap * sizeof(gnode));
        if (!c)
            return NULL;
        if (p->n_chunks == p->cap_chunks) {
            size_t nc = p->cap_chunks ? p->cap_chunks * 2 : 16;
            gnode **cs = realloc(p->chunks, nc * sizeof(*cs));
            if (!cs) {
                free(c);
                return NULL;
            }
            p->chunks = cs;
            p->cap_chunks = nc;
        }
        p->chunks[p->n_chunks++] = c;
        p->chunk = c;
        p->used = 0;
        p->cap = cap;
    }
    return &p->chunk[p->used++];
}

static void pool_reset(npool *p, bool release)
{
    size_t keep = release ? 0 : (p->n_chunks ? 1 : 0);
    for (size_t i = keep; i < p->n_chunks; i++)
        free(p->chunks[i]);
    if (release) {
        free(p->chunks);
        *p = (npool){0};
        return;
    }
    if (p->n_chunks) {
        /* keep the first chunk only */
        p->chunk = p->chunks[0];
        p->n_chunks = 1;
        p->used = 0;
        p->cap = p->cap > 256 ? 256 : p->cap; /* the first chunk's size */
    }
}

/* Node makers: a matcher, its tries and the precomputes all intern, so a
 * set's size is its number of distinct stacks wherever it is computed
 * (the bound MAX_STACKS must cut the same sets in a try as in accept). */
typedef struct maker {
    npool pool;
    gnode **table; /* intern table, or NULL */
    size_t table_n, table_cap;
    bool oom;
} maker;

static gnode *make(maker *mk, uint32_t pos, gnode *parent)
{
    size_t h = 0;
    if (mk->table) {
        h = ((uintptr_t)parent * 0x9E3779B97F4A7C15ull ^ pos) % mk->table_cap;
        for (gnode *n = mk->table[h]; n; n = n->hnext)
            if (n->pos == pos && n->parent == parent)
                return n;
    }
    gnode *n = pool_node(&mk->pool);
    if (!n) {
        mk->oom = true;
        return NULL;
    }
    n->pos = pos;
    n->parent = parent;
    n->hnext = NULL;
    if (mk->table) {
        n->hnext = mk->table[h];
        mk->table[h] = n;
        mk->table_n++;
    }
    return n;
}

static void set_add(gset *s, gnode *n)
{
    for (int i = 0; i < s->n; i++)
        if (s->v[i] == n)
            return;
    if (s->n == MAX_STACKS) {
        s->overflow = true;
        return;
    }
    s->v[s->n++] = n;
}

/* Adds to out the stacks that continue at element pos below parent, each
 * at a byte set (or the markers). */
static void expand(const rt_grammar *g, maker *mk, uint32_t pos, gnode *parent, gset *out, int depth)
{
    if (depth > MAX_EXPAND) {
        out->overflow = true;
        return;
    }
    const gel *e = &g->el[pos];
    if (e->type == GE_CHARS) {
        gnode *n = make(mk, pos, parent);
        if (n)
            set_add(out, n);
        return;
    }
    if (e->type == GE_END) {
        if (!parent)
            set_add(out, ACCEPT);
        else if (parent == SENT)
            set_add(out, SENT);
        else
            expand(g, mk, parent->pos, parent->parent, out, depth + 1);
        return;
    }
    /* a reference: its alternatives, then the element after it */
    gnode *cont = parent;
    if (g->el[pos + 1].type != GE_END) {
        cont = make(mk, pos + 1, parent);
        if (!cont)
            return;
    }
    for (uint32_t a = g->alt_off[e->arg]; a < g->alt_off[e->arg + 1]; a++)
        expand(g, mk, g->alts[a], cont, out, depth + 1);
}

static void advance(const rt_grammar *g, maker *mk, const gset *in, uint8_t byte, gset *out)
{
    out->n = 0;
    out->overflow = in->overflow;
    for (int i = 0; i < in->n; i++) {
        gnode *n = in->v[i];
        if (n == ACCEPT || n == SENT)
            continue;
        if (set_has(g->sets[g->el[n->pos].arg], byte))
            expand(g, mk, n->pos + 1, n->parent, out, 0);
    }
}

static bool has(const gset *s, gnode *marker)
{
    for (int i = 0; i < s->n; i++)
        if (s->v[i] == marker)
            return true;
    return false;
}

static bool alive(const gset *s)
{
    for (int i = 0; i < s->n; i++)
        if (s->v[i] != ACCEPT && s->v[i] != SENT)
            return true;
    return false;
}

/* ---- a position's split of the vocabulary ---- */

typedef struct tlist {
    int32_t *v;
    uint32_t n, cap;
    bool oom;
} tlist;

static void tl_add(tlist *l, int32_t t)
{
    if (l->n == l->cap) {
        uint32_t cap = l->cap ? l->cap * 2 : 64;
        int32_t *v = realloc(l->v, cap * sizeof(int32_t));
        if (!v) {
            l->oom = true;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = t;
}

static void tl_add_node_tokens(const rt_gvocab *v, uint32_t i, tlist *l)
{
    for (uint32_t k = 0; k < v->nodes[i].n_tok; k++)
        tl_add(l, v->toks[v->nodes[i].tok_first + k]);
}

/* The precomputes' deterministic automaton: a state is a set of
 * grammar-wide interned stacks over the sentinel, its transitions found
 * once each. A string's content is one state whatever its length, so a
 * walk of the whole trie costs a table lookup a node. Used under the
 * grammar's lock. */
#define DFA_MAX_STATES 65536
#define UNKNOWN UINT32_MAX

typedef struct dstate {
    gnode **v;
    uint32_t id;
    uint16_t n;
    bool alive, popped, done; /* stacks go on; one left the key's frames; the grammar is complete */
    uint64_t hash;
    struct dstate *hnext;
    uint32_t next[256];
} dstate;

/* A precompute's key: the positions of a stack's top nodes, top first
 * (KEY_DEPTH of them, or fewer and then the stack's bottom). The deeper
 * the key, the fewer tokens leave it and must be tried at each step. */
#define KEY_DEPTH 4

typedef struct pkey {
    uint32_t pos[KEY_DEPTH];
    uint8_t n;
    bool bottom; /* the stack ends below the last: past it the grammar is complete */
} pkey;

typedef struct pentry {
    pkey key;
    gpos *p;
    struct pentry *next;
} pentry;

struct gdfa {
    maker mk;
    dstate **states;
    uint32_t n_states, cap_states;
    dstate **table;
    size_t table_cap;
    pentry **pre; /* the precomputes by key */
    size_t pre_cap;
};

void gdfa_free(struct gdfa *d)
{
    if (!d)
        return;
    for (uint32_t i = 0; i < d->n_states; i++) {
        free(d->states[i]->v);
        free(d->states[i]);
    }
    free(d->states);
    free(d->table);
    for (size_t i = 0; i < d->pre_cap; i++)
        for (pentry *e = d->pre ? d->pre[i] : NULL, *nx; e; e = nx) {
            nx = e->next;
            free(e->p->accepted);
            free(e->p->acc_list);
            free(e->p->uncertain);
            free(e->p);
            free(e);
        }
    free(d->pre);
    free(d->mk.table);
    pool_reset(&d->mk.pool, true);
    free(d);
}

static struct gdfa *dfa_new(void)
{
    struct gdfa *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    d->table_cap = 4099;
    d->mk.table_cap = 4099;
    d->pre_cap = 1021;
    d->table = calloc(d->table_cap, sizeof(dstate *));
    d->mk.table = calloc(d->mk.table_cap, sizeof(gnode *));
    d->pre = calloc(d->pre_cap, sizeof(pentry *));
    if (!d->table || !d->mk.table || !d->pre) {
        gdfa_free(d);
        return NULL;
    }
    return d;
}

static int by_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (gnode *const *)a, y = (uintptr_t) * (gnode *const *)b;
    return x < y ? -1 : x > y;
}

/* The state of a set (sorted here), made if new; UNKNOWN when out of
 * room or memory, or for an ambiguous set. */
static uint32_t dfa_state(struct gdfa *d, gset *s)
{
    if (s->overflow)
        return UNKNOWN;
    qsort(s->v, (size_t)s->n, sizeof(gnode *), by_ptr);
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < s->n; i++)
        h = (h ^ (uintptr_t)s->v[i]) * 1099511628211ull;
    size_t b = h % d->table_cap;
    for (dstate *x = d->table[b]; x; x = x->hnext)
        if (x->hash == h && x->n == s->n && !memcmp(x->v, s->v, (size_t)s->n * sizeof(gnode *)))
            return x->id;
    if (d->n_states == DFA_MAX_STATES)
        return UNKNOWN;
    if (d->n_states == d->cap_states) {
        uint32_t cap = d->cap_states ? d->cap_states * 2 : 64;
        dstate **st = realloc(d->states, cap * sizeof(*st));
        if (!st)
            return UNKNOWN;
        d->states = st;
        d->cap_states = cap;
    }
    dstate *x = malloc(sizeof(*x));
    gnode **v = malloc((size_t)(s->n ? s->n : 1) * sizeof(gnode *));
    if (!x || !v) {
        free(x);
        free(v);
        return UNKNOWN;
    }
    memcpy(v, s->v, (size_t)s->n * sizeof(gnode *));
    *x = (dstate){.v = v, .id = d->n_states, .n = (uint16_t)s->n, .alive = alive(s), .popped = has(s, SENT), .done = has(s, ACCEPT),
                  .hash = h, .hnext = d->table[b]};
    memset(x->next, 0xff, sizeof(x->next));
    d->table[b] = x;
    d->states[d->n_states++] = x;
    return x->id;
}

static uint32_t dfa_next(const rt_grammar *g, struct gdfa *d, uint32_t from, uint8_t byte)
{
    dstate *x = d->states[from];
    if (x->next[byte] != UNKNOWN)
        return x->next[byte];
    gset in, out;
    in.n = x->n;
    in.overflow = false;
    memcpy(in.v, x->v, (size_t)x->n * sizeof(gnode *));
    advance(g, &d->mk, &in, byte, &out);
    if (d->mk.oom)
        return UNKNOWN;
    uint32_t to = dfa_state(d, &out);
    /* the table may have moved: look the state up again */
    if (to != UNKNOWN)
        d->states[from]->next[byte] = to;
    return to;
}

/* Walks the trie from a stack at pos over the sentinel: a token consumed
 * within pos's rule (or ending with it) is accepted whatever is below; one
 * that leaves the rule before its end is uncertain. Under g->mu. */
static gpos *compute_pos(rt_grammar *g, const pkey *key)
{
    const rt_gvocab *v = g->v;
    struct gdfa *d = g->dfa;
    uint32_t *st = malloc(((size_t)v->max_depth + 1) * sizeof(uint32_t));
    bool *sent = malloc((size_t)v->max_depth + 1);
    tlist acc = {0}, unc = {0};
    gpos *p = calloc(1, sizeof(*p));
    if (!st || !sent || !p)
        goto fail;
    gset start = {.n = 0};
    gnode *n0 = key->bottom ? NULL : SENT;
    for (int k = key->n - 1; k >= 0; k--)
        if (!(n0 = make(&d->mk, key->pos[k], n0)))
            goto fail;
    set_add(&start, n0);
    if ((st[0] = dfa_state(d, &start)) == UNKNOWN)
        goto fail;
    sent[0] = false;
    for (uint32_t i = 0; i < v->n_nodes;) {
        const vnode *nd = &v->nodes[i];
        uint16_t dep = nd->depth;
        if (!d->states[st[dep - 1]]->alive) {
            /* the prefix left the rule: everything below is uncertain */
            for (uint32_t j = i; j < nd->end; j++)
                tl_add_node_tokens(v, j, &unc);
            i = nd->end;
            continue;
        }
        uint32_t to = dfa_next(g, d, st[dep - 1], nd->byte);
        if (to == UNKNOWN && d->mk.oom)
            goto fail;
        if (to == UNKNOWN) {
            /* past MAX_STACKS (or the automaton's room): every token
             * from here is tried against the real stack */
            for (uint32_t j = i; j < nd->end; j++)
                tl_add_node_tokens(v, j, &unc);
            i = nd->end;
            continue;
        }
        st[dep] = to;
        const dstate *x = d->states[to];
        sent[dep] = sent[dep - 1] || x->popped;
        if (x->alive || x->popped || x->done)
            tl_add_node_tokens(v, i, &acc);
        else if (sent[dep - 1])
            tl_add_node_tokens(v, i, &unc);
        if (!x->alive && !sent[dep]) {
            i = nd->end; /* rejected, with all it begins */
            continue;
        }
        i++;
    }
    if (acc.oom || unc.oom)
        goto fail;
    if ((size_t)acc.n * 32 >= (size_t)v->n_vocab) {
        p->accepted = calloc(((size_t)v->n_vocab + 31) / 32, sizeof(uint32_t));
        if (!p->accepted)
            goto fail;
        for (uint32_t k = 0; k < acc.n; k++)
            p->accepted[acc.v[k] >> 5] |= 1u << (acc.v[k] & 31);
        free(acc.v);
        acc.v = NULL;
    }
    p->acc_list = acc.v;
    p->n_acc = acc.n;
    p->uncertain = unc.v;
    p->n_unc = unc.n;
    free(st);
    free(sent);
    return p;
fail:
    free(st);
    free(sent);
    free(acc.v);
    free(unc.v);
    free(p);
    return NULL;
}

static pkey key_of(const gnode *s)
{
    pkey k = {.n = 0};
    for (; s && k.n < KEY_DEPTH; s = s->parent)
        k.pos[k.n++] = s->pos;
    k.bottom = !s;
    return k;
}

static size_t key_hash(const pkey *k)
{
    size_t h = k->bottom;
    for (int i = 0; i < k->n; i++)
        h = h * 1000003u ^ k->pos[i];
    return h;
}

/* The precompute for the stack s's top; NULL when out of memory. */
static const gpos *pos_info(rt_grammar *g, const gnode *s)
{
    pkey k = key_of(s);
    gpos *p = NULL;
    pthread_mutex_lock(&g->mu);
    if (!g->dfa && !(g->dfa = dfa_new()))
        goto out;
    size_t h = key_hash(&k) % g->dfa->pre_cap;
    for (pentry *e = g->dfa->pre[h]; e; e = e->next)
        if (!memcmp(&e->key, &k, sizeof(k))) {
            p = e->p;
            goto out;
        }
    pentry *e = malloc(sizeof(*e));
    if (e && (p = compute_pos(g, &k))) {
        e->key = k;
        e->p = p;
        e->next = g->dfa->pre[h];
        g->dfa->pre[h] = e;
    } else {
        free(e);
    }
out:
    pthread_mutex_unlock(&g->mu);
    return p;
}

/* ---- the matcher ---- */

typedef struct cached {
    gset state;
    uint32_t *mask;
    int rc;
    bool valid;
} cached;

struct rt_gmatch {
    rt_grammar *g;
    maker mk;   /* interned nodes of the states */
    maker tmp;  /* scratch for trying tokens */
    gset state;
    bool ended; /* an end-of-generation token was accepted */
    cached cache[N_CACHED];
    int next_slot;
    size_t words;
};

rt_gmatch *rt_gmatch_new(rt_grammar *g)
{
    rt_gmatch *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->g = rt_grammar_ref(g);
    m->words = ((size_t)g->v->n_vocab + 31) / 32;
    m->mk.table_cap = 4096;
    m->mk.table = calloc(m->mk.table_cap, sizeof(gnode *));
    m->tmp.table_cap = 1024;
    m->tmp.table = calloc(m->tmp.table_cap, sizeof(gnode *));
    if (!m->mk.table || !m->tmp.table) {
        rt_gmatch_free(m);
        return NULL;
    }
    for (uint32_t a = g->alt_off[g->root]; a < g->alt_off[g->root + 1]; a++)
        expand(g, &m->mk, g->alts[a], NULL, &m->state, 0);
    m->state.overflow = false; /* cut, as run_stack cuts */
    if (m->mk.oom) {
        rt_gmatch_free(m);
        return NULL;
    }
    return m;
}

void rt_gmatch_free(rt_gmatch *m)
{
    if (!m)
        return;
    for (int i = 0; i < N_CACHED; i++)
        free(m->cache[i].mask);
    free(m->mk.table);
    free(m->tmp.table);
    pool_reset(&m->mk.pool, true);
    pool_reset(&m->tmp.pool, true);
    rt_grammar_free(m->g);
    free(m);
}

bool rt_gmatch_can_end(const rt_gmatch *m)
{
    return has(&m->state, ACCEPT);
}

bool rt_gmatch_must_end(const rt_gmatch *m)
{
    return m->ended || (has(&m->state, ACCEPT) && !alive(&m->state));
}

/* Runs the text through the one stack s into *out (nodes made by mk): false
 * when it cannot follow s. Every set before the last byte must go on and
 * stay within MAX_STACKS; the last may be the grammar's end, and is cut
 * to MAX_STACKS (its stacks are all live parses: the answer stays in the
 * language, a part of it out of reach). The one rule for a try and for
 * accept, so the mask allows exactly what accept takes. */
static bool run_stack(const rt_grammar *g, maker *mk, gnode *s, const char *text, uint32_t len, gset *out)
{
    gset a, b;
    a.n = 1;
    a.v[0] = s;
    a.overflow = false;
    gset *cur = &a, *nxt = &b;
    for (uint32_t i = 0; i < len; i++) {
        advance(g, mk, cur, (uint8_t)text[i], nxt);
        bool last = i + 1 == len;
        if (mk->oom || !(alive(nxt) || (last && has(nxt, ACCEPT))) || (!last && nxt->overflow))
            return false;
        gset *t = cur;
        cur = nxt;
        nxt = t;
    }
    *out = *cur;
    return true;
}

static void maker_clear(maker *mk)
{
    pool_reset(&mk->pool, false);
    memset(mk->table, 0, mk->table_cap * sizeof(gnode *));
    mk->table_n = 0;
}

static bool try_token(rt_gmatch *m, gnode *s, const char *text, uint32_t len)
{
    gset out;
    return run_stack(m->g, &m->tmp, s, text, len, &out);
}

static void set_bit(uint32_t *mask, int32_t t)
{
    mask[t >> 5] |= 1u << (t & 31);
}

static int compute_mask(rt_gmatch *m, uint32_t *mask)
{
    const rt_gvocab *v = m->g->v;
    memset(mask, 0, m->words * sizeof(uint32_t));
    bool any = false;
    for (int i = 0; i < m->state.n; i++) {
        gnode *s = m->state.v[i];
        if (s == ACCEPT)
            continue;
        const gpos *p = pos_info(m->g, s);
        if (!p)
            return -ENOMEM;
        if (p->accepted) {
            for (size_t w = 0; w < m->words; w++)
                mask[w] |= p->accepted[w];
            any = any || p->n_acc > 0;
        } else {
            for (uint32_t k = 0; k < p->n_acc; k++)
                set_bit(mask, p->acc_list[k]);
            any = any || p->n_acc > 0;
        }
        maker_clear(&m->tmp);
        for (uint32_t k = 0; k < p->n_unc; k++) {
            int32_t t = p->uncertain[k];
            if ((mask[t >> 5] >> (t & 31)) & 1)
                continue;
            if (try_token(m, s, v->text[t], v->len[t])) {
                set_bit(mask, t);
                any = true;
            }
        }
        if (m->tmp.oom)
            return -ENOMEM;
    }
    if (rt_gmatch_can_end(m)) {
        for (int k = 0; k < v->n_eog; k++)
            set_bit(mask, v->eog[k]);
        any = any || v->n_eog > 0;
    }
    return any ? 0 : -E2BIG;
}

static bool same_state(const gset *a, const gset *b)
{
    return a->n == b->n && !memcmp(a->v, b->v, (size_t)a->n * sizeof(gnode *));
}

int rt_gmatch_mask(rt_gmatch *m, uint32_t *mask)
{
    if (m->ended) {
        memset(mask, 0, m->words * sizeof(uint32_t));
        return -E2BIG;
    }
    for (int i = 0; i < N_CACHED; i++) {
        cached *c = &m->cache[i];
        if (c->valid && same_state(&c->state, &m->state)) {
            memcpy(mask, c->mask, m->words * sizeof(uint32_t));
            return c->rc;
        }
    }
    int rc = compute_mask(m, mask);
    if (rc == -ENOMEM)
        return rc;
    cached *c = &m->cache[m->next_slot];
    if (!c->mask)
        c->mask = malloc(m->words * sizeof(uint32_t));
    if (c->mask) {
        memcpy(c->mask, mask, m->words * sizeof(uint32_t));
        c->state = m->state;
        c->rc = rc;
        c->valid = true;
        m->next_slot = (m->next_slot + 1) % N_CACHED;
    }
    return rc;
}

int rt_gmatch_accept(rt_gmatch *m, int32_t tok)
{
    const rt_gvocab *v = m->g->v;
    if (m->ended || tok < 0 || tok >= v->n_vocab)
        return -EINVAL;
    for (int k = 0; k < v->n_eog; k++)
        if (v->eog[k] == tok) {
            if (!rt_gmatch_can_end(m))
                return -EINVAL;
            m->ended = true;
            return 0;
        }
    if (!v->text[tok])
        return -EINVAL;
    gset next = {.n = 0}, one;
    bool any = false;
    for (int i = 0; i < m->state.n; i++) {
        gnode *s = m->state.v[i];
        if (s == ACCEPT || s == SENT || !run_stack(m->g, &m->mk, s, v->text[tok], v->len[tok], &one)) {
            if (m->mk.oom)
                return -ENOMEM;
            continue;
        }
        any = true;
        for (int k = 0; k < one.n; k++)
            set_add(&next, one.v[k]);
    }
    if (!any)
        return -EINVAL;
    next.overflow = false; /* cut: see run_stack */
    m->state = next;
    return 0;
}
