/* The HTTP/1.x request parser (RFC 9112), strict: the request line and
 * header fields as the grammar says (no obs-fold, no bare LF or CR, no
 * whitespace before a colon), framing that cannot be smuggled (both
 * Content-Length and Transfer-Encoding, conflicting lengths, chunked from
 * HTTP/1.0 and codings other than chunked are refused), and bodies by
 * Content-Length or chunked coding (sizes, extensions, trailers), bounded
 * by max_header_list and max_body. It reads from the connection's input
 * into its current stream; gateway/http/http1.c drives it and answers what it
 * refuses. A request comes out as it would over HTTP/2: lower-case names,
 * Host as the authority, no connection-specific fields, the body
 * de-chunked. */
#include "gateway/http/http_internal.h"
#include "gateway/base/mem.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>

/* A chunk-size line, extensions included. */
#define GW_H1_CHUNK_LINE_MAX 1024

/* ---- grammar (RFC 9110 5.6.2, 5.5) ---- */

bool gw_h1_is_tchar(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* field-vchar, SP and HTAB; obs-text is allowed, CTLs (CR, LF, NUL) not. */
bool gw_h1_is_field_char(unsigned char ch)
{
    return ch == '\t' || (ch >= 0x20 && ch != 0x7f);
}

static bool is_ows(char ch)
{
    return ch == ' ' || ch == '\t';
}

/* uri-host [ ":" port ] (RFC 3986 3.2.2): reg-name, IPv4 or IP-literal
 * characters; no userinfo, no whitespace. Empty is allowed (RFC 9112 3.2). */
static bool valid_authority(const char *p, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              strchr("-._~%!$&'()*+,;=:[]", ch)) ||
            ch == 0)
            return false;
    }
    return true;
}

/* a[0..alen) equals the NUL-terminated `lit`, in any case. */
static bool eq_ci(const char *a, size_t alen, const char *lit)
{
    return strlen(lit) == alen && !strncasecmp(a, lit, alen);
}

/* Connection-specific fields: neither handed to the application (HTTP/2
 * has none of them) nor taken from it (the server frames the message). */
bool gw_h1_hop_by_hop(const char *name, size_t len)
{
    return eq_ci(name, len, "connection") || eq_ci(name, len, "keep-alive") ||
           eq_ci(name, len, "proxy-connection") || eq_ci(name, len, "transfer-encoding") ||
           eq_ci(name, len, "upgrade") || eq_ci(name, len, "te") || eq_ci(name, len, "content-length");
}

/* ---- request head ---- */

static int stream_add_header(gw_http_stream *s, const char *name, size_t nlen, const char *value, size_t vlen)
{
    if (s->n_headers == s->cap_headers) {
        size_t cap = s->cap_headers ? s->cap_headers * 2 : 16;
        gw_http_header *h = gw_mem_realloc(s->headers, cap * sizeof(*h));
        if (!h)
            return -ENOMEM;
        s->headers = h;
        s->cap_headers = cap;
    }
    char *n = gw_arena_strndup(&s->arena, name, nlen);
    const char *v = gw_arena_strndup(&s->arena, value, vlen);
    if (!n || !v)
        return -ENOMEM;
    for (char *p = n; *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p - 'A' + 'a');
    s->headers[s->n_headers++] = (gw_http_header){n, v};
    return 0;
}

/* One header line (without its CRLF): name and trimmed value. 0 or -1. */
static int parse_field(const char *p, size_t len, size_t *nlen, const char **value, size_t *vlen)
{
    size_t i = 0;
    while (i < len && gw_h1_is_tchar((unsigned char)p[i]))
        i++;
    /* No whitespace before the colon (RFC 9112 5.1), and a line that
     * starts with whitespace is obs-fold, which we refuse (5.2). */
    if (i == 0 || i == len || p[i] != ':')
        return -1;
    *nlen = i++;
    while (i < len && is_ows(p[i]))
        i++;
    size_t end = len;
    while (end > i && is_ows(p[end - 1]))
        end--;
    for (size_t k = i; k < end; k++)
        if (!gw_h1_is_field_char((unsigned char)p[k]))
            return -1;
    *value = p + i;
    *vlen = end - i;
    return 0;
}

/* Splits the request target (RFC 9112 3.2) into path and, for the
 * absolute form, authority. 0 or -1. */
static int parse_target(gw_http_stream *s, const char *t, size_t len, const char **authority)
{
    *authority = NULL;
    if (t[0] == '/') {
        s->path = gw_arena_strndup(&s->arena, t, len);
        return s->path ? 0 : -ENOMEM;
    }
    if (len == 1 && t[0] == '*') { /* asterisk form: OPTIONS only */
        if (strcmp(s->method, "OPTIONS"))
            return -1;
        s->path = gw_arena_strndup(&s->arena, t, len);
        return s->path ? 0 : -ENOMEM;
    }
    size_t skip = len > 7 && !strncasecmp(t, "http://", 7)    ? 7
                  : len > 8 && !strncasecmp(t, "https://", 8) ? 8
                                                              : 0;
    if (!skip)
        return -1; /* authority form (CONNECT) and anything else */
    size_t a = skip;
    while (a < len && t[a] != '/' && t[a] != '?')
        a++;
    if (a == skip || !valid_authority(t + skip, a - skip))
        return -1;
    if (!(*authority = gw_arena_strndup(&s->arena, t + skip, a - skip)))
        return -ENOMEM;
    if (a == len || t[a] == '?') { /* "http://h" and "http://h?q" have the path "/" */
        char *p = malloc(len - a + 2);
        if (!p)
            return -ENOMEM;
        p[0] = '/';
        memcpy(p + 1, t + a, len - a);
        s->path = gw_arena_strndup(&s->arena, p, len - a + 1);
        free(p);
    } else {
        s->path = gw_arena_strndup(&s->arena, t + a, len - a);
    }
    return s->path ? 0 : -ENOMEM;
}

/* Connection options one request may name: real clients send one or two
 * ("keep-alive", "Upgrade, HTTP2-Settings"), and a bound keeps dropping
 * the fields they name linear in the head's size. */
#define GW_H1_CONN_TOKENS 16

typedef struct head_info {
    int status; /* the answer when the head is refused */
    const char *why;
    const char *host;
    int n_host, n_te, n_tokens;
    bool has_cl, expect_continue, close, keep_alive;
    uint64_t content_length;
    const char *te;
    size_t te_len;
    struct {
        const char *p;
        size_t len;
    } tokens[GW_H1_CONN_TOKENS]; /* of Connection, other than close and keep-alive */
} head_info;

#define HEAD_FAIL(st, msg)                                                                                   \
    do {                                                                                                     \
        hi->status = (st);                                                                                   \
        hi->why = (msg);                                                                                     \
        return 1;                                                                                            \
    } while (0)

/* Reads a field that frames or steers the message; the rest are kept.
 * 0, 1 (refused: hi says why) or -ENOMEM. */
static int head_field(gw_http_stream *s, head_info *hi, const char *name, size_t nlen, const char *v,
                      size_t vlen, bool http10)
{
    if (eq_ci(name, nlen, "host")) {
        if (!valid_authority(v, vlen))
            HEAD_FAIL(400, "invalid Host header");
        hi->n_host++;
        return (hi->host = gw_arena_strndup(&s->arena, v, vlen)) ? 0 : -ENOMEM;
    }
    if (eq_ci(name, nlen, "content-length")) {
        uint64_t n = 0;
        if (vlen == 0)
            HEAD_FAIL(400, "invalid Content-Length");
        for (size_t i = 0; i < vlen; i++) {
            if (v[i] < '0' || v[i] > '9')
                HEAD_FAIL(400, "invalid Content-Length");
            if (n > (UINT64_MAX - 9) / 10)
                n = UINT64_MAX; /* over any max_body: 413 */
            else
                n = n * 10 + (uint64_t)(v[i] - '0');
        }
        if (hi->has_cl && n != hi->content_length)
            HEAD_FAIL(400, "conflicting Content-Length");
        hi->has_cl = true;
        hi->content_length = n;
        return stream_add_header(s, name, nlen, v, vlen); /* as HTTP/2 passes it on */
    }
    if (eq_ci(name, nlen, "transfer-encoding")) {
        hi->n_te++;
        hi->te = v;
        hi->te_len = vlen;
        return 0;
    }
    if (eq_ci(name, nlen, "expect")) {
        if (!eq_ci(v, vlen, "100-continue"))
            HEAD_FAIL(417, "only Expect: 100-continue is supported");
        hi->expect_continue = !http10;
        return 0;
    }
    if (eq_ci(name, nlen, "connection")) {
        for (size_t i = 0; i < vlen;) { /* 1#token, empty elements allowed */
            while (i < vlen && (v[i] == ',' || is_ows(v[i])))
                i++;
            size_t start = i;
            while (i < vlen && v[i] != ',')
                i++;
            size_t end = i;
            while (end > start && is_ows(v[end - 1]))
                end--;
            if (end == start)
                continue;
            if (eq_ci(v + start, end - start, "close")) {
                hi->close = true;
            } else if (eq_ci(v + start, end - start, "keep-alive")) {
                hi->keep_alive = true;
            } else {
                if (hi->n_tokens == GW_H1_CONN_TOKENS)
                    HEAD_FAIL(400, "too many Connection options");
                hi->tokens[hi->n_tokens].p = v + start;
                hi->tokens[hi->n_tokens++].len = end - start;
            }
        }
        return 0;
    }
    if (eq_ci(name, nlen, "te"))
        return eq_ci(v, vlen, "trailers") ? stream_add_header(s, name, nlen, v, vlen) : 0;
    if (gw_h1_hop_by_hop(name, nlen))
        return 0;
    return stream_add_header(s, name, nlen, v, vlen);
}

/* Drops the fields that Connection names (RFC 9110 7.6.1). */
static void drop_connection_fields(gw_http_stream *s, const head_info *hi)
{
    size_t kept = 0;
    for (size_t i = 0; i < s->n_headers; i++) {
        const char *name = s->headers[i].name;
        bool named = false;
        for (int k = 0; k < hi->n_tokens && !named; k++)
            named = eq_ci(hi->tokens[k].p, hi->tokens[k].len, name);
        if (!named)
            s->headers[kept++] = s->headers[i];
    }
    s->n_headers = kept;
}

/* Parses a whole head p[0..len), which ends with the empty line, into the
 * current stream. 0, 1 (refused: hi says why) or -ENOMEM. */
static int parse_head(gw_http_conn *c, const char *p, size_t len, head_info *hi)
{
    gw_h1 *h = &c->h1;
    gw_http_stream *s = h->cur;
    const char *end = p + len, *line = p;
    const char *nl = memchr(line, '\n', (size_t)(end - line));
    if (!nl || nl == line || nl[-1] != '\r')
        HEAD_FAIL(400, "malformed request line");
    /* method SP request-target SP HTTP-version */
    const char *q = line, *le = nl - 1;
    while (q < le && gw_h1_is_tchar((unsigned char)*q))
        q++;
    if (q == line || q == le || *q != ' ')
        HEAD_FAIL(400, "malformed request line");
    if (!(s->method = gw_arena_strndup(&s->arena, line, (size_t)(q - line))))
        return -ENOMEM;
    /* from here on, refusals too are answered without a body */
    s->head = !strcmp(s->method, "HEAD");
    const char *t = ++q;
    while (q < le && (unsigned char)*q > 0x20 && (unsigned char)*q < 0x7f)
        q++;
    if (q == t || q == le || *q != ' ')
        HEAD_FAIL(400, "malformed request line");
    const char *t_end = q++;
    size_t vlen = (size_t)(le - q);
    if (vlen == 8 && !memcmp(q, "HTTP/1.1", 8))
        h->http10 = false;
    else if (vlen == 8 && !memcmp(q, "HTTP/1.0", 8))
        h->http10 = true;
    else if (vlen == 8 && !memcmp(q, "HTTP/1.", 7) && q[7] >= '2' && q[7] <= '9')
        h->http10 = false; /* a later 1.x is served as 1.1 (RFC 9112 2.3) */
    else if (vlen == 8 && !memcmp(q, "HTTP/", 5) && q[5] >= '0' && q[5] <= '9' && q[6] == '.' &&
             q[7] >= '0' && q[7] <= '9')
        HEAD_FAIL(505, "only HTTP/1.0 and HTTP/1.1 are served here");
    else
        HEAD_FAIL(400, "malformed request line");
    const char *authority;
    int rc = parse_target(s, t, (size_t)(t_end - t), &authority);
    if (rc == -ENOMEM)
        return rc;
    if (rc)
        HEAD_FAIL(400, "malformed request target");

    for (line = nl + 1; line < end; line = nl + 1) {
        nl = memchr(line, '\n', (size_t)(end - line));
        if (!nl || nl == line || nl[-1] != '\r')
            HEAD_FAIL(400, "header line not ended by CRLF");
        size_t ll = (size_t)(nl - 1 - line);
        if (ll == 0)
            break; /* the empty line */
        if (is_ows(line[0]))
            HEAD_FAIL(400, "obsolete line folding is not accepted");
        size_t nlen, flen;
        const char *v;
        if (parse_field(line, ll, &nlen, &v, &flen))
            HEAD_FAIL(400, "malformed header field");
        if ((rc = head_field(s, hi, line, nlen, v, flen, h->http10)))
            return rc;
    }
    drop_connection_fields(s, hi);
    h->keep_alive = h->http10 ? hi->keep_alive && !hi->close : !hi->close;

    if (hi->n_host > 1)
        HEAD_FAIL(400, "more than one Host header");
    const char *repeated = gw_stream_repeated_field(s);
    if (repeated)
        HEAD_FAIL(400, repeated);
    if (hi->n_host == 0 && !h->http10)
        HEAD_FAIL(400, "HTTP/1.1 request without Host");
    s->authority = authority ? authority : hi->host;
    if (hi->n_te) {
        /* Smuggling defences (RFC 9112 6.1, 6.3): both framings, or
         * chunked from an HTTP/1.0 client, cannot be trusted. */
        if (hi->has_cl)
            HEAD_FAIL(400, "both Content-Length and Transfer-Encoding");
        if (h->http10)
            HEAD_FAIL(400, "Transfer-Encoding in an HTTP/1.0 request");
        if (hi->n_te > 1 || !eq_ci(hi->te, hi->te_len, "chunked"))
            HEAD_FAIL(501, "only Transfer-Encoding: chunked is supported");
    }
    return 0;
}

int gw_h1_parse_head(gw_http_conn *c, const char **why)
{
    gw_h1 *h = &c->h1;
    const gw_http_limits *lim = &c->srv->limits;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t len = evbuffer_get_length(in);
    struct evbuffer_ptr pos;
    *why = NULL;
    /* Resume where the last search stopped: a head sent a byte at a time
     * is searched once, not once per byte. */
    size_t from = h->scanned > 3 ? h->scanned - 3 : 0;
    if (evbuffer_ptr_set(in, &pos, from, EVBUFFER_PTR_SET) == 0)
        pos = evbuffer_search(in, "\r\n\r\n", 4, &pos);
    else
        pos.pos = -1;
    if (pos.pos < 0) {
        /* A head whose lines end in bare LF never holds CRLF CRLF: it
         * would wait for the header timeout and be closed unanswered. Two
         * LFs in a row cannot occur before a valid head's end, nor LF CRLF
         * (a last line ended in bare LF, then the empty line) outside CRLF
         * CRLF, which is not there. */
        static const char *const bare[] = {"\n\n", "\n\r\n"};
        for (int i = 0; i < 2; i++) {
            struct evbuffer_ptr lf;
            if (evbuffer_ptr_set(in, &lf, from, EVBUFFER_PTR_SET) == 0 &&
                evbuffer_search(in, bare[i], strlen(bare[i]), &lf).pos >= 0) {
                *why = "request head lines must end in CRLF";
                return 400;
            }
        }
        h->scanned = len;
        if (len <= lim->max_header_list)
            return GW_H1_MORE;
    }
    size_t head_len = pos.pos < 0 ? len : (size_t)pos.pos + 4;
    if (head_len > lim->max_header_list) {
        /* A request line that alone is over the limit: the target is too
         * long (RFC 9112 3), 414 as nginx answers it. */
        struct evbuffer_ptr end;
        if (evbuffer_ptr_set(in, &end, lim->max_header_list, EVBUFFER_PTR_SET) == 0 &&
            evbuffer_search_range(in, "\r\n", 2, NULL, &end).pos < 0) {
            *why = "request target too long";
            return 414;
        }
        return 431;
    }
    h->scanned = 0;
    const char *p = (const char *)evbuffer_pullup(in, (ev_ssize_t)head_len);
    gw_http_stream *s = p ? gw_stream_new(c, ++h->n_requests) : NULL;
    if (!s)
        return GW_H1_NOMEM;
    h->cur = s;
    head_info hi = {0};
    int rc = parse_head(c, p, head_len, &hi);
    evbuffer_drain(in, head_len);
    if (rc == -ENOMEM)
        return GW_H1_NOMEM;
    if (rc) {
        *why = hi.why;
        return hi.status;
    }
    s->state = GW_SS_BODY;
    h->chunked_body = hi.n_te > 0;
    h->chunk = GW_H1_CHUNK_SIZE;
    h->body_left = hi.has_cl ? hi.content_length : 0;
    h->trailer_bytes = 0;
    h->expect_continue = hi.expect_continue && (h->chunked_body || h->body_left > 0);
    if (h->body_left > lim->max_body)
        return 413; /* before 100-continue: the client need not send the body */
    return GW_H1_DONE;
}

/* ---- request body ---- */

/* Room for `more` bytes, grown by doubling up to `max`, the body limit
 * checked before. 0 or -ENOMEM. */
static int body_reserve(gw_http_stream *s, size_t more, size_t max)
{
    if (s->body_cap - s->body_len >= more)
        return 0;
    size_t need = s->body_len + more, cap = s->body_cap < 16384 ? 16384 : s->body_cap;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
    if (cap > max)
        cap = max;
    if (cap < need) /* max shrank under a body already admitted (reload) */
        cap = need;
    uint8_t *b = gw_mem_realloc(s->body, cap);
    if (!b)
        return -ENOMEM;
    s->body = b;
    s->body_cap = cap;
    return 0;
}

/* Moves up to body_left bytes from the input into the body. */
static int take_data(gw_http_conn *c, struct evbuffer *in)
{
    gw_http_stream *s = c->h1.cur;
    size_t avail = evbuffer_get_length(in);
    size_t n = avail < c->h1.body_left ? avail : (size_t)c->h1.body_left;
    if (n == 0)
        return 0;
    if (body_reserve(s, n, c->srv->limits.max_body))
        return -ENOMEM;
    if (evbuffer_remove(in, s->body + s->body_len, n) != (int)n)
        return -ENOMEM;
    s->body_len += n;
    c->h1.body_left -= n;
    return 0;
}

/* A line of at most `max` bytes before its CRLF: its length, -1 when more
 * input is needed, -2 when it is too long or not ended by CRLF, -3 when
 * memory ran out. */
static ssize_t peek_line(struct evbuffer *in, size_t max, const char **line)
{
    size_t avail = evbuffer_get_length(in), look = avail < max + 2 ? avail : max + 2;
    if (look == 0)
        return -1;
    const char *p = (const char *)evbuffer_pullup(in, (ev_ssize_t)look);
    if (!p)
        return -3;
    const char *nl = memchr(p, '\n', look);
    if (!nl)
        return look == max + 2 ? -2 : -1;
    if (nl == p || nl[-1] != '\r')
        return -2;
    *line = p;
    return nl - 1 - p;
}

/* chunked = *chunk last-chunk trailer-section CRLF (RFC 9112 7.1).
 * Returns as gw_h1_parse_body. */
static int chunked_body(gw_http_conn *c, struct evbuffer *in, const char **why)
{
    gw_h1 *h = &c->h1;
    const gw_http_limits *lim = &c->srv->limits;
    gw_http_stream *s = h->cur;
    for (;;) {
        const char *line;
        ssize_t ll;
        switch (h->chunk) {
        case GW_H1_CHUNK_SIZE: {
            if ((ll = peek_line(in, GW_H1_CHUNK_LINE_MAX, &line)) == -1)
                return GW_H1_MORE;
            if (ll == -3)
                return GW_H1_NOMEM;
            if (ll < 0) {
                *why = "malformed chunk size line";
                return 400;
            }
            uint64_t n = 0;
            ssize_t i = 0;
            bool huge = false;
            for (; i < ll; i++) {
                char ch = line[i];
                int d = ch >= '0' && ch <= '9'   ? ch - '0'
                        : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                        : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                                 : -1;
                if (d < 0)
                    break;
                huge |= n > (UINT64_MAX >> 4);
                n = (n << 4) | (uint64_t)d;
            }
            bool ok = i > 0;
            ssize_t k = i; /* then nothing, or BWS ";" chunk-ext */
            while (ok && k < ll && is_ows(line[k]))
                k++;
            if (ok && k < ll) {
                ok = line[k] == ';';
                for (k++; ok && k < ll; k++)
                    ok = gw_h1_is_field_char((unsigned char)line[k]);
            } else if (k != i) {
                ok = false; /* whitespace with no extension after it */
            }
            if (!ok) {
                *why = "malformed chunk size line";
                return 400;
            }
            evbuffer_drain(in, (size_t)ll + 2);
            /* huge first: a size past 2^64 has wrapped, and 2^64 itself
             * would read as the last chunk (the rest of the body taken for
             * the next request) */
            if (huge)
                return 413;
            if (n == 0) {
                h->chunk = GW_H1_CHUNK_TRAILER;
                break;
            }
            if (s->body_len > lim->max_body || n > lim->max_body - s->body_len)
                return 413;
            h->body_left = n;
            h->chunk = GW_H1_CHUNK_DATA;
            break;
        }
        case GW_H1_CHUNK_DATA:
            if (take_data(c, in))
                return GW_H1_NOMEM;
            if (h->body_left)
                return GW_H1_MORE;
            h->chunk = GW_H1_CHUNK_CRLF;
            break;
        case GW_H1_CHUNK_CRLF: {
            if (evbuffer_get_length(in) < 2)
                return GW_H1_MORE;
            const unsigned char *p = evbuffer_pullup(in, 2);
            if (!p)
                return GW_H1_NOMEM;
            if (p[0] != '\r' || p[1] != '\n') {
                *why = "chunk data not followed by CRLF";
                return 400;
            }
            evbuffer_drain(in, 2);
            h->chunk = GW_H1_CHUNK_SIZE;
            break;
        }
        case GW_H1_CHUNK_TRAILER: {
            size_t room =
                lim->max_header_list > h->trailer_bytes ? lim->max_header_list - h->trailer_bytes : 0;
            if ((ll = peek_line(in, room, &line)) == -1)
                return GW_H1_MORE;
            if (ll == -3)
                return GW_H1_NOMEM;
            size_t nlen, vlen;
            const char *v;
            if (ll == -2 && evbuffer_get_length(in) >= room + 2) {
                *why = "request trailers too large";
                return 431;
            }
            if (ll < 0 || (ll > 0 && (is_ows(line[0]) || parse_field(line, (size_t)ll, &nlen, &v, &vlen)))) {
                *why = "malformed trailer field";
                return 400;
            }
            evbuffer_drain(in, (size_t)ll + 2);
            if (ll == 0)
                return GW_H1_DONE;
            h->trailer_bytes += (size_t)ll + 2; /* counted, not kept, as over HTTP/2 */
            break;
        }
        }
    }
}

int gw_h1_parse_body(gw_http_conn *c, const char **why)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    *why = NULL;
    if (c->h1.chunked_body)
        return chunked_body(c, in, why);
    if (take_data(c, in))
        return GW_H1_NOMEM;
    return c->h1.body_left == 0 ? GW_H1_DONE : GW_H1_MORE;
}
