/* gw_alog: lines reach the file whole and in order, a line longer than the
 * stream's buffer included; a reopen moves later lines to the new file;
 * a reader that stops reading costs dropped lines, counted, never a wait;
 * a file is created with the mode asked for; a path's secrets never reach a
 * line (gw_alog_redact_path). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "gateway/front/access_log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[] = "/tmp/test_access_log.XXXXXX";

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *b = malloc(8 << 20);
    assert_non_null(b);
    *len = fread(b, 1, (8 << 20) - 1, f);
    b[*len] = '\0';
    fclose(f);
    return b;
}

static void test_lines_whole_and_in_order(void **state)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/a.log", dir);
    gw_alog *l = gw_alog_open(path, 0640);
    assert_non_null(l);
    FILE *f = gw_alog_file(l);
    /* 300 KB: stdio hands it over in pieces of its 64 KiB buffer */
    size_t big = 300 * 1000 + 7;
    for (int i = 0; i < 50; i++) {
        fprintf(f, "line %d ", i);
        if (i == 25)
            for (size_t k = 0; k < big; k++)
                fputc('a' + (int)(k % 26), f);
        fputs("end\n", f);
        fflush(f);
    }
    gw_alog_close(l, 5000);
    size_t len;
    char *text = slurp(path, &len);
    char *p = text;
    for (int i = 0; i < 50; i++) {
        char want[32];
        snprintf(want, sizeof(want), "line %d ", i);
        assert_memory_equal(p, want, strlen(want));
        char *nl = strchr(p, '\n');
        assert_non_null(nl);
        assert_int_equal((size_t)(nl - p), strlen(want) + (i == 25 ? big : 0) + 3);
        p = nl + 1;
    }
    assert_int_equal((size_t)(p - text), len);
    free(text);
}

static void test_reopen(void **state)
{
    char path[128], moved[128];
    snprintf(path, sizeof(path), "%s/r.log", dir);
    snprintf(moved, sizeof(moved), "%s/r.log.1", dir);
    gw_alog *l = gw_alog_open(path, 0640);
    assert_non_null(l);
    fputs("first\n", gw_alog_file(l));
    fflush(gw_alog_file(l));
    assert_int_equal(rename(path, moved), 0);
    assert_int_equal(gw_alog_reopen(l, path), 0);
    fputs("second\n", gw_alog_file(l));
    fflush(gw_alog_file(l));
    char bad[160];
    snprintf(bad, sizeof(bad), "%s/no/such/dir.log", dir);
    assert_int_equal(gw_alog_reopen(l, bad), -ENOENT);
    fputs("third\n", gw_alog_file(l));
    fflush(gw_alog_file(l));
    gw_alog_close(l, 5000);
    size_t len;
    char *a = slurp(moved, &len), *b = slurp(path, &len);
    assert_string_equal(a, "first\n");
    assert_string_equal(b, "second\nthird\n");
    free(a);
    free(b);
}

/* stdout on a pipe nobody reads: writing 4 MB of lines neither blocks nor
 * loses a line unaccounted for. */
static void test_stalled_reader(void **state)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    int saved = dup(1);
    assert_true(saved >= 0);
    assert_int_equal(dup2(fds[1], 1), 1);
    gw_alog *l = gw_alog_open("stdout", 0640);
    assert_int_equal(dup2(saved, 1), 1);
    close(saved);
    close(fds[1]);
    assert_non_null(l);
    char line[1001];
    memset(line, 'x', 999);
    line[999] = '\n';
    line[1000] = '\0';
    for (int i = 0; i < 4000; i++) {
        fputs(line, gw_alog_file(l));
        fflush(gw_alog_file(l));
    }
    uint64_t dropped = gw_alog_dropped(l);
    /* the pipe holds 64 KiB, each buffer 1 MiB: most of the 4 MB is dropped */
    assert_true(dropped > 1000 && dropped < 4000);
    /* a reader again: everything not dropped arrives */
    size_t got = 0;
    char buf[65536];
    gw_alog_close(l, 0); /* gives up at once on the stalled write; the thread lives on */
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    for (int idle = 0; idle < 200;) {
        ssize_t n = read(fds[0], buf, sizeof(buf));
        if (n > 0) {
            got += (size_t)n;
            idle = 0;
        } else if (n == 0) {
            break;
        } else {
            idle++;
            nanosleep(&(struct timespec){0, 10000000}, NULL);
        }
    }
    close(fds[0]);
    assert_int_equal(got % 1000, 0);
    assert_int_equal(got / 1000 + dropped, 4000);
}

/* Created with the mode asked for, under any umask that leaves it; kept by
 * a reopen. */
static void test_file_mode(void **state)
{
    char path[128], moved[140];
    snprintf(path, sizeof(path), "%s/m.log", dir);
    snprintf(moved, sizeof(moved), "%s.1", path);
    mode_t old = umask(022);
    gw_alog *l = gw_alog_open(path, 0640);
    assert_non_null(l);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0640);
    assert_int_equal(rename(path, moved), 0);
    assert_int_equal(gw_alog_reopen(l, path), 0);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0640);
    gw_alog_close(l, 5000);
    umask(old);
}

static void redacts(const char *path, const char *want)
{
    char *got = gw_alog_redact_path(path);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

#define KEY "ig-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789_-abcd"

/* Every form issue 33 listed, and the names a key travels under elsewhere;
 * what is no secret is left as sent. */
static void test_redact_path(void **state)
{
    redacts("/v1/models", "/v1/models");
    redacts("/dashboard?key=" KEY, "/dashboard?key=REDACTED");
    redacts("/v1/models?x=1&key=s3cret&y=2", "/v1/models?x=1&key=REDACTED&y=2");
    redacts("/v1/models?KEY=s3cret", "/v1/models?KEY=REDACTED");
    redacts("/v1/models?%6bey=s3cret", "/v1/models?%6bey=REDACTED");
    redacts("/v1/models?%6B%45%59=s3cret", "/v1/models?%6B%45%59=REDACTED");
    redacts("/v1/models?%256bey=s3cret", "/v1/models?%256bey=REDACTED"); /* encoded twice */
    redacts("/v1/models?api_key=a&token=b&access_token=c&X-Api-Key=d&password=e&sig=f&Authorization=g",
            "/v1/models?api_key=REDACTED&token=REDACTED&access_token=REDACTED&X-Api-Key=REDACTED"
            "&password=REDACTED&sig=REDACTED&Authorization=REDACTED");
    redacts("/v1/models?a=1;secret=2;b=3", "/v1/models?a=1;secret=REDACTED;b=3");
    redacts("/v1/models?k%00ey=s3cret&%2Bkey%2B=t", "/v1/models?k%00ey=REDACTED&%2Bkey%2B=REDACTED");
    redacts("/v1/models?model=m&n=2&q=", "/v1/models?model=m&n=2&q=");
    redacts("/v1/models?key=&key", "/v1/models?key=REDACTED&key");
    /* a key under a name no list foresaw, or none */
    redacts("/v1/models?x=" KEY "&y=ig-short", "/v1/models?x=REDACTED&y=ig-short");
    redacts("/v1/models?" KEY, "/v1/models?REDACTED");
    redacts("/v1/models?&&", "/v1/models?&&");
    redacts("/?", "/?");
    /* a name too long to judge is taken for a secret */
    char name[400], path[500], want[500];
    memset(name, 'a', sizeof(name) - 1);
    name[sizeof(name) - 1] = '\0';
    snprintf(path, sizeof(path), "/x?%s=1", name);
    snprintf(want, sizeof(want), "/x?%s=REDACTED", name);
    redacts(path, want);
}

static int setup(void **state)
{
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lines_whole_and_in_order),
        cmocka_unit_test(test_reopen),
        cmocka_unit_test(test_stalled_reader),
        cmocka_unit_test(test_file_mode),
        cmocka_unit_test(test_redact_path),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
