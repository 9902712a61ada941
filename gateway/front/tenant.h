/* Tenants: API-key authentication and per-tenant limits (local token
 * buckets; fleet-wide through Redis once routing lands).
 *
 * A presented key is hashed (SHA-256) and looked up by that hash among
 * the configured ones, then compared in constant time: the cost does not
 * grow with the number of keys, and timing tells nothing of any key. Buckets refill continuously: rps allows
 * bursts of max(1, rps) requests, tpm bursts of tpm tokens. */
#ifndef GW_TENANT_H
#define GW_TENANT_H

#include "gateway/config/config.h"

#include <stdbool.h>

typedef struct gw_tenants gw_tenants;
typedef struct gw_tenant gw_tenant;

/* Built from the config's tenants; NULL on out of memory. Buckets of
 * tenants whose name survives a reload keep their state (pass the old
 * table as `prev`, which is then freed by the caller). */
gw_tenants *gw_tenants_new(const gw_config *c, const gw_tenants *prev);
void gw_tenants_free(gw_tenants *t);
/* True when no tenant is configured (no auth). */
bool gw_tenants_open(const gw_tenants *t);

/* The tenant whose key is `bearer` (the token after "Bearer "), or NULL. */
gw_tenant *gw_tenants_auth(gw_tenants *t, const char *bearer);
/* The tenant named `name` (e.g. from a peer gateway's x-infergate-tenant
 * on a forwarded request), or NULL. Not constant-time: names are not
 * secrets. */
gw_tenant *gw_tenants_find(const gw_tenants *t, const char *name);
const char *gw_tenant_name(const gw_tenant *t);
bool gw_tenant_admin(const gw_tenant *t);
/* priority: batch — every request is batch, whatever it asks. */
bool gw_tenant_batch_only(const gw_tenant *t);
bool gw_tenant_allows_model(const gw_tenant *t, const char *model);

/* Takes one request and `tokens` tokens from the buckets at time now_s
 * (monotonic seconds). 0 when allowed; otherwise -EAGAIN and *retry_after_s
 * (whole seconds, >= 1) until enough would be back. Nothing is taken on
 * refusal. A request asking for more tokens than the whole tpm burst is
 * admitted once the bucket is full, and leaves it in debt, so it waits
 * rather than failing forever. */
int gw_tenant_admit(gw_tenant *t, double now_s, double tokens, int *retry_after_s);
/* Gives back tokens charged but not used (the estimate was high). */
void gw_tenant_refund(gw_tenant *t, double now_s, double tokens);
/* Takes tokens used beyond the charge (the estimate was low), into debt
 * if need be: the next requests wait for it. */
void gw_tenant_charge(gw_tenant *t, double now_s, double tokens);

#endif
