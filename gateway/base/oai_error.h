/* OpenAI's error object, {"error":{"message","type","param","code"}}: the
 * one encoder of it, for every answer an infergate process makes itself
 * (the HTTP server's refusals, the front door's, the worker's). Every
 * string is escaped for JSON as jansson's compact dump does it (", \ and
 * the control characters; the rest of UTF-8 as it is), and bytes that are
 * not UTF-8 become U+FFFD (base/utf8.h): a message that quotes what a
 * client sent, or that a buffer cut inside a character, is still valid
 * JSON. Dependency-free, as all of base/: the runtime links it too. */
#ifndef GW_OAI_ERROR_H
#define GW_OAI_ERROR_H

#include <stddef.h>

/* Writes the object into buf (cap bytes, NUL-terminated) and returns its
 * length, the NUL not counted. message is a NUL-terminated string (NULL:
 * empty); type, param and code are too, NULL writing null. A message too
 * long for buf is cut at a character's boundary, so that what is written
 * is always one whole object; 0 (buf "" when cap > 0) when buf cannot hold
 * it even with an empty message. */
size_t gw_oai_error_write(char *buf, size_t cap, const char *message, const char *type, const char *param,
                          const char *code);

/* The same, whole, in a malloc'd string (the caller frees it); *len, when
 * len is given, its length. NULL: out of memory. */
char *gw_oai_error_json(const char *message, const char *type, const char *param, const char *code,
                        size_t *len);

#endif
