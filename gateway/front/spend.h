/* Spend and budgets (issue 31, item 3): what each request cost (the
 * serving region's price per million input and output tokens times the
 * tokens of its usage), its tokens, energy and gCO2e, counted per tenant,
 * model and region into /metrics and, with Redis, fleet-wide
 * (routing/sync.h: route_sync_spend_add); and each tenant's budget (its
 * config's budget: {daily, monthly}) held against the fleet's figure.
 *
 * The figure a budget is held to: the tenant's spend this UTC day / month
 * as Redis last said it (read at each of its requests while connected),
 * plus what this gateway counted that Redis has not acknowledged yet.
 * While Redis is away this gateway keeps counting and sends what it
 * counted when Redis returns, so no spend is lost (a gateway stopped
 * during the outage loses what it had not sent); meanwhile each gateway
 * holds its own spend since the outage to (budget - the last fleet figure
 * it saw). Without Redis the figure is this gateway's own since it
 * started. A request's cost is known only at its end: requests admitted
 * before the budget was reached may take it past by their own cost.
 *
 * Counted once, where the request came in: a request a peer region
 * forwarded here is counted by that peer (it knows the tenant's budget
 * and which region served it). */
#ifndef GW_SPEND_H
#define GW_SPEND_H

#include <stdbool.h>

struct gw_serve;
typedef struct gw_spend gw_spend;

/* The cost of prompt and completion tokens at prices per million tokens. */
double gw_spend_cost(double price_in, double price_out, double prompt_tokens, double completion_tokens);

/* g's (base, metrics, and sync when it has one, looked up at each use);
 * starts the timer that sends what Redis has not taken yet. NULL on out
 * of memory. */
gw_spend *gw_spend_new(struct gw_serve *g);
/* Unsent spend is dropped (said on stderr). */
void gw_spend_free(gw_spend *sp);

#endif
