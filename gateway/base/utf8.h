/* UTF-8 well-formedness, by Unicode's rules, for every part that writes
 * text it did not make into JSON (error messages, generated tokens): what
 * is not UTF-8 is replaced, one U+FFFD per maximal subpart, as browsers
 * and Python's "replace" do. */
#ifndef GW_UTF8_H
#define GW_UTF8_H

#include <stddef.h>

/* U+FFFD REPLACEMENT CHARACTER, in UTF-8. */
#define GW_UTF8_REPLACEMENT "\xEF\xBF\xBD"

/* Length of the well-formed UTF-8 sequence at p (n > 0 bytes left; Unicode
 * table 3-7: no overlongs, no surrogates, nothing above U+10FFFF), or 0 when
 * it is ill-formed; then *skip is the length of its maximal subpart (at
 * least 1), which is what one U+FFFD replaces. */
size_t gw_utf8_seq(const unsigned char *p, size_t n, size_t *skip);

#endif
