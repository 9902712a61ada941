/* A small Prometheus registry: counters, gauges and histograms with label
 * sets, rendered in the text exposition format (version 0.0.4). Series are
 * created on first use; the number of series is capped (max_series) so a
 * client that invents label values cannot grow it without bound — past the
 * cap, updates to new series are dropped and counted in
 * infergate_metrics_dropped_total. Not thread-safe: the loop owns it. */
#ifndef GW_METRICS_H
#define GW_METRICS_H

#include <stddef.h>

typedef struct gw_metrics gw_metrics;

typedef enum gw_metric_type { GW_COUNTER, GW_GAUGE, GW_HISTOGRAM } gw_metric_type;

gw_metrics *gw_metrics_new(size_t max_series);
void gw_metrics_free(gw_metrics *m);

/* Declares a family (once, before use). buckets: upper bounds for
 * histograms, ascending (+Inf is implied). Returns 0, -EEXIST, -ENOMEM,
 * or -EINVAL for a name that is not [a-zA-Z_:][a-zA-Z0-9_:]* or bounds
 * that are not finite and strictly ascending. Families render in this
 * order; infergate_metrics_dropped_total is built in and renders last. */
int gw_metrics_describe(gw_metrics *m, const char *name, gw_metric_type type, const char *help,
                        const double *buckets, int n_buckets);

/* labels is a preformatted label list without braces, e.g.
 * `model="m",status="200"` (build values with gw_metrics_escape), or "".
 * An update to an undeclared family or one of another type is ignored, as
 * are negative counter increments and NaN observations. */
void gw_metrics_add(gw_metrics *m, const char *name, const char *labels, double v);     /* counter */
void gw_metrics_set(gw_metrics *m, const char *name, const char *labels, double v);     /* gauge */
void gw_metrics_observe(gw_metrics *m, const char *name, const char *labels, double v); /* histogram */
/* A counter kept elsewhere (a worker's restarts), brought up to its total;
 * never down. */
void gw_metrics_count_to(gw_metrics *m, const char *name, const char *labels, double total);
/* Removes every series of a gauge family (e.g. per-worker gauges before
 * they are set again). */
void gw_metrics_clear(gw_metrics *m, const char *name);
/* The sum of a counter's or gauge's series whose labels begin with prefix
 * (e.g. `tenant="acme",`; "" for all); 0 for an unknown family. For the
 * dashboard, which shows what /metrics counts. */
double gw_metrics_sum(gw_metrics *m, const char *name, const char *prefix);

/* Escapes a label value (\\, \", \n) into buf; truncates to cap-1 bytes. */
void gw_metrics_escape(const char *value, char *buf, size_t cap);

/* The whole exposition, malloc'd; *len its length. NULL on out of memory. */
char *gw_metrics_render(const gw_metrics *m, size_t *len);

#endif
