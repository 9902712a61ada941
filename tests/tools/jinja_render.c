/* jinja_render TEMPLATE [REPEAT]: renders a Jinja template (runtime/jinja)
 * once per input line, for the tests that hold it against Python's Jinja2
 * (tests/unit/jinja_oracle.py) and for timing it.
 *
 * Each stdin line is a JSON object {"plain": {...}, "trusted": {...},
 * "now": epoch seconds}; each stdout line is {"text": ..., "plain":
 * [[off, len], ...]} or {"error": ..., "rc": N}. With REPEAT, every case is
 * rendered that many times and the time per render is written to stderr.
 * Exit 0 (whatever the renders did), 2 for a bad template or input. */
#include "runtime/jinja/jinja.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *more = realloc(buf, cap *= 2);
            if (!more) {
                free(buf);
                buf = NULL;
            }
            buf = more;
        }
    }
    fclose(f);
    *len = n;
    return buf;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void emit(int rc, const rt_jinja_output *out, const char *err)
{
    json_t *o = json_object();
    if (rc) {
        json_object_set_new(o, "error", json_string(err));
        json_object_set_new(o, "rc", json_integer(rc));
    } else {
        json_object_set_new(o, "text", json_stringn(out->text, out->len));
        json_t *spans = json_array();
        for (int i = 0; i < out->n_plain; i++)
            json_array_append_new(spans, json_pack("[II]", (json_int_t)out->plain[i].off,
                                                   (json_int_t)out->plain[i].len));
        json_object_set_new(o, "plain", spans);
    }
    char *s = json_dumps(o, JSON_COMPACT);
    if (s)
        puts(s);
    free(s);
    json_decref(o);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: jinja_render TEMPLATE [REPEAT] < cases.jsonl\n");
        return 2;
    }
    int repeat = argc > 2 ? atoi(argv[2]) : 0;
    size_t len;
    char *src = slurp(argv[1], &len);
    if (!src) {
        perror(argv[1]);
        return 2;
    }
    char err[512];
    rt_jinja *t;
    if (rt_jinja_parse(src, len, &t, err, sizeof(err))) {
        fprintf(stderr, "%s: %s\n", argv[1], err);
        printf("{\"parse_error\": \"see stderr\"}\n");
        free(src);
        return 2;
    }
    free(src);
    char *line = NULL;
    size_t cap = 0;
    double total = 0;
    long renders = 0;
    while (getline(&line, &cap, stdin) > 0) {
        json_error_t je;
        json_t *c = json_loads(line, 0, &je);
        if (!c) {
            fprintf(stderr, "bad input line: %s\n", je.text);
            return 2;
        }
        rt_jinja_input in = {
            .plain = json_object_get(c, "plain"),
            .trusted = json_object_get(c, "trusted"),
            .now = (time_t)json_integer_value(json_object_get(c, "now")),
        };
        rt_jinja_output out;
        int rc = rt_jinja_render(t, &in, &out, err, sizeof(err));
        emit(rc, &out, err);
        rt_jinja_output_dispose(&out);
        if (repeat > 0) {
            double t0 = now_s();
            for (int i = 0; i < repeat; i++) {
                rt_jinja_render(t, &in, &out, err, sizeof(err));
                rt_jinja_output_dispose(&out);
            }
            total += now_s() - t0;
            renders += repeat;
        }
        json_decref(c);
    }
    if (renders)
        fprintf(stderr, "%.1f us per render (%ld renders)\n", total / (double)renders * 1e6, renders);
    free(line);
    rt_jinja_free(t);
    return 0;
}
