/* Tenants (see tenant.h): API-key authentication by the key's hash and the
 * per-tenant request and token buckets. Time comes from the caller (now_s),
 * so the buckets are plain arithmetic and tests can drive the clock. */
#include "gateway/front/tenant.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Refill arithmetic in doubles is not exact (10 rps for 0.1 s may give
 * 0.9999999999); a request must not be refused over that. */
#define BUCKET_EPS 1e-9
/* Retry-After beyond a day means "the debt is huge": still a whole number. */
#define RETRY_MAX_S 86400.0

typedef struct bucket {
    double level, cap, rate; /* rate 0: unlimited */
} bucket;

struct gw_tenant {
    char *name;
    char **models;
    int n_models;
    bool any_model, admin, batch_only;
    bucket req, tok;
    double last;  /* now_s of the last refill */
    bool started; /* buckets start full at the first call that gives a time */
};

typedef struct key_entry {
    uint8_t hash[32];
    int tenant;
} key_entry;

struct gw_tenants {
    gw_tenant *v;
    int n;
    gw_tenant **by_name; /* v sorted by name */
    key_entry *keys;
    int n_keys;
    /* keys by their hash's first bytes (open addressing): index into keys,
     * -1 for an empty slot; at least twice as many slots as keys */
    int32_t *slots;
    uint32_t slot_mask;
};

/* ---- table ---- */

static uint32_t slot_of(const uint8_t hash[32])
{
    return (uint32_t)hash[0] | (uint32_t)hash[1] << 8 | (uint32_t)hash[2] << 16 | (uint32_t)hash[3] << 24;
}

static int index_keys(gw_tenants *t)
{
    size_t cap = 2;
    while (cap < 2 * (size_t)t->n_keys)
        cap *= 2;
    if (cap > UINT32_MAX || !(t->slots = malloc(cap * sizeof(*t->slots))))
        return -ENOMEM;
    memset(t->slots, 0xff, cap * sizeof(*t->slots));
    t->slot_mask = (uint32_t)(cap - 1);
    for (int k = 0; k < t->n_keys; k++) {
        uint32_t i = slot_of(t->keys[k].hash) & t->slot_mask;
        while (t->slots[i] >= 0)
            i = (i + 1) & t->slot_mask;
        t->slots[i] = k;
    }
    return 0;
}

static int by_name_cmp(const void *a, const void *b)
{
    return strcmp((*(gw_tenant *const *)a)->name, (*(gw_tenant *const *)b)->name);
}

gw_tenant *gw_tenants_find(const gw_tenants *t, const char *name)
{
    if (!t || !name)
        return NULL;
    int lo = 0, hi = t->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int d = strcmp(t->by_name[mid]->name, name);
        if (d == 0)
            return t->by_name[mid];
        if (d < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static void bucket_init(bucket *b, double cap, double rate, const bucket *prev)
{
    b->cap = cap;
    b->rate = rate;
    /* A bucket that was unlimited before had no level worth keeping. */
    b->level = prev && prev->rate > 0 ? fmin(prev->level, cap) : cap;
}

static int tenant_init(gw_tenant *t, const gw_tenant_cfg *c, const gw_tenant *prev)
{
    if (!(t->name = strdup(c->name)))
        return -ENOMEM;
    if (c->n_models && !(t->models = calloc((size_t)c->n_models, sizeof(*t->models))))
        return -ENOMEM;
    for (int i = 0; i < c->n_models; i++) {
        if (!(t->models[i] = strdup(c->models[i])))
            return -ENOMEM;
        t->n_models = i + 1;
        if (!strcmp(c->models[i], "*"))
            t->any_model = true;
    }
    t->admin = c->admin;
    t->batch_only = c->batch_only;
    double rps = c->rps > 0 ? c->rps : 0, tpm = c->tpm > 0 ? c->tpm : 0;
    bucket_init(&t->req, fmax(1.0, rps), rps, prev ? &prev->req : NULL);
    bucket_init(&t->tok, tpm, tpm / 60.0, prev ? &prev->tok : NULL);
    if (prev && prev->started) {
        t->started = true;
        t->last = prev->last;
    }
    return 0;
}

gw_tenants *gw_tenants_new(const gw_config *c, const gw_tenants *prev)
{
    gw_tenants *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    int n = c ? c->n_tenants : 0;
    if (n == 0)
        return t;
    size_t n_keys = 0;
    for (int i = 0; i < n; i++)
        n_keys += (size_t)c->tenants[i].n_keys;
    if (n_keys > INT32_MAX || !(t->v = calloc((size_t)n, sizeof(*t->v))) ||
        !(t->by_name = malloc((size_t)n * sizeof(*t->by_name))) ||
        !(t->keys = malloc((n_keys ? n_keys : 1) * sizeof(*t->keys))))
        goto fail;
    for (int i = 0; i < n; i++) {
        const gw_tenant_cfg *tc = &c->tenants[i];
        t->n = i + 1;
        if (tenant_init(&t->v[i], tc, gw_tenants_find(prev, tc->name)))
            goto fail;
        for (int j = 0; j < tc->n_keys; j++) {
            memcpy(t->keys[t->n_keys].hash, tc->key_hashes[j], 32);
            t->keys[t->n_keys++].tenant = i;
        }
        t->by_name[i] = &t->v[i];
    }
    qsort(t->by_name, (size_t)n, sizeof(*t->by_name), by_name_cmp);
    if (index_keys(t))
        goto fail;
    return t;
fail:
    gw_tenants_free(t);
    return NULL;
}

void gw_tenants_free(gw_tenants *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n; i++) {
        for (int j = 0; j < t->v[i].n_models; j++)
            free(t->v[i].models[j]);
        free(t->v[i].models);
        free(t->v[i].name);
    }
    free(t->v);
    free(t->by_name);
    /* Only hashes, but a table of them has no business lingering. */
    if (t->keys)
        OPENSSL_cleanse(t->keys, (size_t)t->n_keys * sizeof(*t->keys));
    free(t->keys);
    free(t->slots);
    free(t);
}

bool gw_tenants_open(const gw_tenants *t)
{
    return !t || t->n == 0;
}

/* ---- authentication ---- */

gw_tenant *gw_tenants_auth(gw_tenants *t, const char *bearer)
{
    if (!t || !bearer || t->n_keys == 0)
        return NULL;
    uint8_t h[EVP_MAX_MD_SIZE];
    unsigned int h_len = 0;
    if (!EVP_Digest(bearer, strlen(bearer), h, &h_len, EVP_sha256(), NULL) || h_len != 32)
        return NULL;
    /* Found by the hash, not by a walk over every key, so a wrong key costs
     * the same with four million keys as with one. What the time can tell
     * is whether slots near SHA-256(key) are taken: bits of stored hashes,
     * from which no key can be had. The key itself is compared in constant
     * time. */
    gw_tenant *found = NULL;
    for (uint32_t i = slot_of(h) & t->slot_mask; t->slots[i] >= 0; i = (i + 1) & t->slot_mask)
        if (CRYPTO_memcmp(h, t->keys[t->slots[i]].hash, 32) == 0) {
            found = &t->v[t->keys[t->slots[i]].tenant];
            break;
        }
    OPENSSL_cleanse(h, sizeof(h));
    return found;
}

const char *gw_tenant_name(const gw_tenant *t)
{
    return t->name;
}

bool gw_tenant_admin(const gw_tenant *t)
{
    return t->admin;
}

bool gw_tenant_batch_only(const gw_tenant *t)
{
    return t->batch_only;
}

bool gw_tenant_allows_model(const gw_tenant *t, const char *model)
{
    if (!model)
        return false;
    if (t->any_model)
        return true;
    for (int i = 0; i < t->n_models; i++)
        if (!strcmp(t->models[i], model))
            return true;
    return false;
}

/* ---- limits ---- */

static void refill(gw_tenant *t, double now_s)
{
    if (!t->started) {
        t->started = true;
        t->last = now_s;
        t->req.level = t->req.cap;
        t->tok.level = t->tok.cap;
        return;
    }
    /* A clock that steps back refills nothing (and does not drain). */
    if (!(now_s > t->last))
        return;
    double dt = now_s - t->last;
    t->last = now_s;
    bucket *bs[2] = {&t->req, &t->tok};
    for (int i = 0; i < 2; i++)
        if (bs[i]->rate > 0)
            bs[i]->level = fmin(bs[i]->cap, bs[i]->level + dt * bs[i]->rate);
}

/* Seconds until b holds `need`; 0 when it already does. */
static double wait_for(const bucket *b, double need)
{
    if (b->rate <= 0 || b->level + BUCKET_EPS >= need)
        return 0;
    return (need - b->level) / b->rate;
}

int gw_tenant_admit(gw_tenant *t, double now_s, double tokens, int *retry_after_s)
{
    if (!(tokens > 0)) /* also NaN */
        tokens = 0;
    refill(t, now_s);
    /* More than a full burst can never be in the bucket: ask for a full one. */
    double need_tok = fmin(tokens, t->tok.cap);
    double wait = fmax(wait_for(&t->req, 1), wait_for(&t->tok, need_tok));
    if (wait > 0) {
        if (retry_after_s) {
            double w = ceil(fmin(wait, RETRY_MAX_S) - BUCKET_EPS);
            *retry_after_s = w < 1 ? 1 : (int)w;
        }
        return -EAGAIN;
    }
    if (t->req.rate > 0)
        t->req.level -= 1;
    if (t->tok.rate > 0)
        t->tok.level -= tokens;
    return 0;
}

void gw_tenant_charge(gw_tenant *t, double now_s, double tokens)
{
    if (!(tokens > 0) || t->tok.rate <= 0)
        return;
    refill(t, now_s);
    t->tok.level -= tokens;
}

void gw_tenant_refund(gw_tenant *t, double now_s, double tokens)
{
    if (!(tokens > 0) || t->tok.rate <= 0)
        return;
    refill(t, now_s);
    t->tok.level = fmin(t->tok.cap, t->tok.level + tokens);
}
