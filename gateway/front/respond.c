/* Answers the front door makes itself, rather than a worker: OpenAI error
 * objects (gateway/base/oai_error.h) and the small bodies of its own
 * endpoints, each with the request's id. */
#include "gateway/front/request_internal.h"

#include "gateway/base/oai_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The body bytes a response of `len` sends: none to a HEAD request, whose
 * response says the length and stops there (the access log's "bytes"). */
static size_t body_bytes(const gw_front_req *p, size_t len)
{
    return strcmp(p->req->method, "HEAD") ? len : 0;
}

/* An OpenAI error object, with one more header when `extra` is given. */
static void respond_with(gw_front_req *p, int status, const gw_http_header *extra, const char *type,
                         const char *code, const char *param, const char *msg)
{
    size_t len = 0;
    char *body = gw_oai_error_json(msg, type, param, code, &len);
    gw_http_header h[3] = {{"content-type", "application/json"}, {"x-request-id", p->id}};
    if (extra)
        h[2] = *extra;
    p->status = status;
    if (!body || gw_http_respond(p->stream, status, h, extra ? 3 : 2, body, len))
        gw_http_reset(p->stream);
    else
        p->bytes_out += body_bytes(p, len);
    free(body);
}

void gw_front_respond(gw_front_req *p, int status, const char *type, const char *code, const char *param,
                      int retry_after, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    char ra[16];
    snprintf(ra, sizeof(ra), "%d", retry_after);
    const gw_http_header h = {"retry-after", ra};
    respond_with(p, status, retry_after > 0 ? &h : NULL, type, code, param, msg);
}

void gw_front_respond_final(gw_front_req *p, int status, const char *type, const char *code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const gw_http_header h = {"x-should-retry", "false"};
    respond_with(p, status, &h, type, code, NULL, msg);
}

void gw_front_respond_not_allowed(gw_front_req *p, const char *allow)
{
    char msg[96];
    snprintf(msg, sizeof(msg), "%.16s is not allowed here (allowed: %s)", p->req->method, allow);
    const gw_http_header h = {"allow", allow};
    respond_with(p, 405, &h, "invalid_request_error", "method_not_allowed", NULL, msg);
}

void gw_front_respond_plain(gw_front_req *p, int status, const char *ctype, const char *body, size_t len)
{
    gw_http_header h[2] = {{"content-type", ctype}, {"x-request-id", p->id}};
    p->status = status;
    p->bytes_out += body_bytes(p, len);
    if (gw_http_respond(p->stream, status, h, 2, body, len))
        gw_http_reset(p->stream);
}
