/* The operators' page (/dashboard) as a browser sees it: how it gets its
 * admin key without keeping it in the URL (a login form whose POST sets a
 * cookie, HttpOnly and SameSite=Strict, valid for /dashboard only), and
 * the headers every page of it carries: no scripts, frames, referrers or
 * caches. The table itself is regions.c's (gw_regions_dashboard). */
#include "gateway/front/request_internal.h"
#include "gateway/base/url.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COOKIE "infergate_dashboard"
#define LOGIN_BODY_MAX 2048 /* a form with one key: read from anyone, so small */

/* What a browser may do with a page of the dashboard: show it, nothing
 * more (its styles are inline; it has no scripts or images). */
static const gw_http_header page_headers[] = {
    {"content-security-policy",
     "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"},
    {"x-frame-options", "DENY"},
    {"referrer-policy", "no-referrer"},
    {"cache-control", "no-store"},
    {"x-content-type-options", "nosniff"},
};
#define N_PAGE_HEADERS (sizeof(page_headers) / sizeof(page_headers[0]))

/* s[0..n) decoded into out, NUL-terminated; false when it does not fit or
 * holds a NUL. */
static bool url_decode(const char *s, size_t n, char *out, size_t cap)
{
    long m = cap ? gw_url_decode(s, n, out, cap - 1) : -1;
    if (m < 0 || memchr(out, '\0', (size_t)m))
        return false;
    out[m] = '\0';
    return true;
}

const char *gw_dashboard_key(const gw_http_request *r, char *buf, size_t cap)
{
    for (size_t i = 0; i < r->n_headers; i++) {
        if (strcmp(r->headers[i].name, "cookie"))
            continue;
        /* "a=1; infergate_dashboard=KEY; b=2" (HTTP/2 may split it in several) */
        for (const char *c = r->headers[i].value; *c;) {
            c += strspn(c, " ;");
            size_t n = strcspn(c, ";");
            if (n > sizeof(COOKIE) && !strncmp(c, COOKIE "=", sizeof(COOKIE)))
                return url_decode(c + sizeof(COOKIE), n - sizeof(COOKIE), buf, cap) ? buf : NULL;
            c += n;
        }
    }
    const char *q = strstr(r->path, "?key=");
    return q ? q + 5 : NULL; /* a link made before the login form */
}

/* A page of the dashboard, with its headers and up to two more. */
static void send_page(gw_front_req *p, int status, const char *body, size_t len, const gw_http_header *more,
                      size_t n_more)
{
    gw_http_header h[N_PAGE_HEADERS + 4] = {{"content-type", "text/html; charset=utf-8"}, {"x-request-id", p->id}};
    size_t k = 2;
    for (size_t i = 0; i < N_PAGE_HEADERS; i++)
        h[k++] = page_headers[i];
    for (size_t i = 0; i < n_more && i < 2; i++)
        h[k++] = more[i];
    p->status = status;
    p->bytes_out += strcmp(p->req->method, "HEAD") ? len : 0;
    if (gw_http_respond(p->stream, status, h, k, body, len))
        gw_http_reset(p->stream);
}

/* The cookie that holds key, percent-encoded (a configured key may hold
 * any byte a cookie may not); "" (expired) to forget it. */
static void set_cookie(char *out, size_t cap, const char *key)
{
    size_t o = (size_t)snprintf(out, cap, COOKIE "=");
    static const char hex[] = "0123456789ABCDEF";
    for (const unsigned char *c = (const unsigned char *)key; *c && o + 4 < cap; c++) {
        if ((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '-' ||
            *c == '_' || *c == '.') {
            out[o++] = (char)*c;
        } else {
            out[o++] = '%';
            out[o++] = hex[*c >> 4];
            out[o++] = hex[*c & 15];
        }
    }
    /* Secure: browsers take it over http:// from localhost alone */
    snprintf(out + o, cap - o, "; Path=/dashboard; HttpOnly; Secure; SameSite=Strict; Max-Age=%d",
             *key ? 43200 : 0);
}

void gw_dashboard_login_page(gw_front_req *p, int status, const char *why)
{
    char body[1024];
    int n = snprintf(body, sizeof(body),
                     "<!doctype html><html><head><meta charset=utf-8><title>infergate dashboard</title><style>"
                     "body{font:14px system-ui,sans-serif;margin:2em;color:#222}.bad{color:#b00}</style></head>"
                     "<body><h1>infergate dashboard</h1>%s%s%s<form method=post action=/dashboard/login>"
                     "<label>Admin API key <input type=password name=key autocomplete=off autofocus></label> "
                     "<button>Open</button></form></body></html>\n",
                     why ? "<p class=bad>" : "", why ? why : "", why ? "</p>" : "");
    /* a key the page was refused with is not kept */
    char forget[160];
    set_cookie(forget, sizeof(forget), "");
    const gw_http_header h = {"set-cookie", forget};
    send_page(p, status, body, (size_t)n, &h, why ? 1 : 0);
}

void gw_dashboard_page(gw_front_req *p, const char *body, size_t len, const char *url_key)
{
    /* A key in the URL moves to the cookie: the page's refreshes go to
     * /dashboard without it. */
    char cookie[1024];
    gw_http_header h = {"set-cookie", cookie};
    if (url_key) {
        char key[512];
        size_t n = strcspn(url_key, "&");
        if (n < sizeof(key)) {
            memcpy(key, url_key, n);
            key[n] = '\0';
            set_cookie(cookie, sizeof(cookie), key);
        } else {
            url_key = NULL;
        }
    }
    send_page(p, 200, body, len, &h, url_key ? 1 : 0);
}

bool gw_dashboard_login_fits(const gw_http_request *r)
{
    const char *cl = gw_http_header_get(r, "content-length");
    return cl && strspn(cl, "0123456789") == strlen(cl) && strlen(cl) < 6 && atoi(cl) <= LOGIN_BODY_MAX;
}

void gw_dashboard_login(gw_front_req *p)
{
    const gw_http_request *r = p->req;
    if (strcmp(r->method, "POST")) {
        gw_front_respond_not_allowed(p, "POST");
        return;
    }
    if (!gw_dashboard_login_fits(r) || r->body_len > LOGIN_BODY_MAX) {
        gw_dashboard_login_page(p, 413, "The form is larger than a key.");
        return;
    }
    /* key=VALUE among the form's fields */
    char key[512] = "";
    const char *b = (const char *)r->body, *end = b + r->body_len;
    bool found = false;
    while (b < end && !found) {
        const char *amp = memchr(b, '&', (size_t)(end - b));
        size_t n = (size_t)((amp ? amp : end) - b);
        if (n >= 4 && !memcmp(b, "key=", 4))
            found = url_decode(b + 4, n - 4, key, sizeof(key));
        b += n + 1;
    }
    gw_tenants *ts = p->g->tenants;
    gw_tenant *t = found && key[0] ? gw_tenants_auth(ts, key) : NULL;
    if (!gw_tenants_open(ts) && !t) {
        gw_dashboard_login_page(p, 401, "That is not a valid API key.");
        return;
    }
    if (t && !gw_tenant_admin(t)) {
        gw_dashboard_login_page(p, 403, "That key is not an admin key.");
        return;
    }
    snprintf(p->tenant, sizeof(p->tenant), "%s", t ? gw_tenant_name(t) : "");
    char cookie[1200];
    set_cookie(cookie, sizeof(cookie), key);
    const gw_http_header h[2] = {{"location", "/dashboard"}, {"set-cookie", cookie}};
    static const char moved[] = "<!doctype html><a href=/dashboard>/dashboard</a>\n";
    send_page(p, 303, moved, sizeof(moved) - 1, h, t ? 2 : 1);
}
