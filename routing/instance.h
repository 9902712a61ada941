/* A region served by several gateways (behind one load balancer): each
 * gateway's record is one entry of the region's Redis hash, field
 * "instance:<id>" (the process's random 16-hex-digit id), and readers merge
 * the entries into the one record routing sees.
 *
 * An entry's value is the record's fields (route_record_to_fields) as
 * lines of NAME=VALUE: one HSET writes it whole, and a field of a record
 * never holds a newline (route_record_check refuses control characters). */
#ifndef ROUTE_INSTANCE_H
#define ROUTE_INSTANCE_H

#include "routing/region.h"

#include <stddef.h>

#define ROUTE_INSTANCE_PREFIX "instance:"
#define ROUTE_INSTANCE_ID_LEN 16
/* The longest entry: every field at its longest, name, '=' and newline. */
#define ROUTE_INSTANCE_VALUE_MAX (ROUTE_N_FIELDS * (16 + sizeof(((route_field *)0)->value)))

/* Whether the hash field name[0..len) is an instance entry; its id, NUL
 * terminated, into id (ROUTE_INSTANCE_ID_LEN + 1 bytes). */
bool route_instance_field(const char *name, size_t len, char id[ROUTE_INSTANCE_ID_LEN + 1]);
/* Writes r (which passes route_record_check) as an entry's value into out
 * (ROUTE_INSTANCE_VALUE_MAX bytes). Returns its length. */
size_t route_instance_encode(const route_record *r, char *out);
/* Reads an entry's value into r (name set by the caller), as
 * route_record_from_fields reads a hash: unknown names are ignored, and on
 * error r is unchanged and err says why. */
int route_instance_decode(route_record *r, const char *value, size_t len, char *err, size_t err_len);

/* The region's record from its n gateways' entries, in the order every
 * reader agrees on (by id). The healthy entries merge; the endpoint of the
 * first healthy one with an endpoint is the region's, and only the entries
 * that publish that endpoint (their load balancer's) count, as only they
 * share its traffic.
 * Among them: capacity, running and queued add up; the TTFT and per-token
 * estimates are averaged over the entries that have one, weighted by
 * capacity; models and residency tags are those every entry has (a request
 * may reach any of them), each once, with per-model load where every entry gives it
 * (the totals then count those models' workers only); prices are the
 * highest. updated_ms is the newest, and version a digest of every
 * entry's, so the region is news while any of its gateways writes. With no
 * healthy entry the first one stands, unhealthy. out->instances is the
 * number merged (with none healthy, of entries). -ENOENT for n 0. */
int route_instances_merge(const route_record *inst, int n, route_record *out);

#endif
