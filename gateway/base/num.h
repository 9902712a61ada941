/* Number parsing for the command line and the config: whole-string,
 * range-checked, never silently wrapping (strtol/strtod with every error
 * checked). */
#ifndef GW_NUM_H
#define GW_NUM_H

#include <stdint.h>

/* Parses a whole decimal number in [min, max]; 0 or -1. */
int gw_parse_int(const char *s, long min, long max, long *out);
int gw_parse_float(const char *s, double *out);
/* A whole decimal number from 0 to 2^64 - 1 (no sign, no spaces). */
int gw_parse_u64(const char *s, uint64_t *out);

#endif
