/* Tests of the Redis sync of region state and of the shared rate limit
 * (routing/sync.c) against a real redis-server that this test starts on a
 * free 127.0.0.1 port (with a password, on db 3, nothing saved to disk).
 * Two route_sync instances on one libevent loop play two gateways.
 *
 * Faults are made on the real server: SIGSTOP (commands hang: the deadline
 * path), SIGKILL and a restart on the same port (the reconnect path),
 * SCRIPT FLUSH (NOSCRIPT), keys that expire. Every wait is bounded
 * (WAIT_MS); nothing asserts on timing, so where a test must show that an
 * update came by PUBLISH, the full read is set too far away to deliver it.
 * The server is killed at exit, also when a test fails, and dies with this
 * process when it is killed. Skipped (77)
 * without redis-server. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gateway/base/clock.h"
#include "gateway/cmd/cli.h"
#include "routing/region.h"
#include "routing/sync.h"

#include <hiredis/hiredis.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#define WAIT_MS 10000
#define PASS "s3cret-test"
#define DB 3
#define CLUSTER "t"

static const char *redis_path;
static pid_t redis_pid;
static int redis_port;
static char port_s[16];

static struct event_base *base;
static struct event *keepalive;

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- the server ---- */

static void redis_kill(void)
{
    if (redis_pid > 0) {
        kill(redis_pid, SIGCONT);
        kill(redis_pid, SIGKILL);
        waitpid(redis_pid, NULL, 0);
        redis_pid = 0;
    }
}

/* A port for a redis-server started later: below the kernel's ephemeral
 * range, so no outgoing connection takes it first, and held by a lock file
 * (as tests/integration/harness.py does) so tests running side by side never
 * pick the same one. The lock's descriptor stays open until the test exits. */
static int free_port(void)
{
    char path[128];
    unsigned start = (unsigned)getpid() * 7919u;

    mkdir("/tmp/infergate-test-ports", 0777);
    for (unsigned i = 0; i < 500; i++) {
        int port = 20768 + (int)((start + i * 131u) % 12000u); /* 20768..32767 */
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        snprintf(path, sizeof(path), "/tmp/infergate-test-ports/%d", port);
        int lock = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
        if (lock == -1)
            continue;
        if (flock(lock, LOCK_EX | LOCK_NB) == -1) {
            close(lock);
            continue;
        }
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd != -1 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
            close(fd);
            return port; /* `lock` stays open: the port is ours */
        }
        if (fd != -1)
            close(fd);
        close(lock);
    }
    return -1;
}

/* A blocking client for the test's own look at the server. */
static redisContext *rc_connect(void)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", redis_port, tv);
    if (!c)
        return NULL;
    if (c->err) {
        redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    redisReply *r = redisCommand(c, "AUTH %s", PASS);
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    r = ok ? redisCommand(c, "SELECT %d", DB) : NULL;
    ok = r && r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (!ok) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* One command on a fresh connection; the reply (or NULL) is the caller's. */
static redisReply *rc_command(const char *fmt, ...)
{
    redisContext *c = rc_connect();
    if (!c)
        return NULL;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    return r;
}

static long long rc_integer(const char *fmt, const char *arg)
{
    redisReply *r = rc_command(fmt, arg);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    return v;
}

static int redis_start(void)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == -1)
        return -1;
    if (pid == 0) {
        /* Dies with the test even when atexit cannot run (a crash, ctest's
         * timeout kill). */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int null = open("/dev/null", O_RDWR);
        if (null != -1) {
            dup2(null, 1);
            dup2(null, 2);
        }
        execl(redis_path, "redis-server", "--port", port_s, "--bind", "127.0.0.1", "--save", "",
              "--appendonly", "no", "--requirepass", PASS, (char *)NULL);
        _exit(127);
    }
    redis_pid = pid;
    for (int i = 0; i < 250; i++) { /* 5 s */
        redisReply *r = rc_command("PING");
        bool up = r && r->type == REDIS_REPLY_STATUS;
        freeReplyObject(r);
        if (up)
            return 0;
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            redis_pid = 0;
            return -1;
        }
        usleep(20000);
    }
    redis_kill();
    return -1;
}

/* ---- the loop ---- */

static void on_keepalive(evutil_socket_t fd, short what, void *arg) {}

static void run_for(int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_base_loopexit(base, &tv);
    event_base_dispatch(base);
}

#define WAIT_UNTIL(cond)                                                                                     \
    do {                                                                                                     \
        int64_t t0_ = mono_ms();                                                                             \
        while (!(cond)) {                                                                                    \
            if (mono_ms() - t0_ > WAIT_MS)                                                                   \
                fail_msg("%s:%d: timed out waiting for %s", __FILE__, __LINE__, #cond);                      \
            run_for(5);                                                                                      \
        }                                                                                                    \
    } while (0)

/* ---- fixture: two gateways ---- */

typedef struct gateway {
    route_table *table;
    route_sync *sync;
    route_record rec;
} gateway;

static gateway ga, gb, gc; /* gc: a third, for the tests of a shared region name */

static void make_rec(route_record *r, const char *name, const char *tag, double pin, double pout)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->name, sizeof(r->name), "%s", name);
    snprintf(r->endpoint, sizeof(r->endpoint), "tls:127.0.0.1:%d", 9000 + (int)strlen(name));
    snprintf(r->models[0], sizeof(r->models[0]), "tiny");
    snprintf(r->models[1], sizeof(r->models[1]), "tiny-chat");
    r->n_models = 2;
    snprintf(r->tags[0], sizeof(r->tags[0]), "%s", tag);
    r->n_tags = 1;
    r->price_in = pin;
    r->price_out = pout;
    snprintf(r->gpu, sizeof(r->gpu), "cpu");
    r->capacity = 8;
    r->ttft_ms = 20;
    r->tpot_ms = 5;
    r->healthy = true;
}

static void test_opts(route_sync_opts *o)
{
    route_sync_opts_default(o);
    o->host = "127.0.0.1";
    o->port = redis_port;
    o->password = PASS;
    o->db = DB;
    o->cluster = CLUSTER;
    o->heartbeat_ms = 200;
    o->ttl_heartbeats = 3;
    o->full_read_ms = 60000; /* tests that need the full read set it */
    o->command_timeout_ms = 300;
    o->reconnect_min_ms = 50;
    o->reconnect_max_ms = 400;
}

static void gw_start(gateway *g, const route_sync_opts *o, const char *name, const char *tag, double pin,
                     double pout)
{
    route_table_opts to = {
        .stale_after_ms = 1500, .eject_after = 3, .eject_base_ms = 1000, .eject_max_ms = 8000};
    g->table = route_table_new(&to, 16);
    assert_non_null(g->table);
    g->sync = route_sync_new(base, o, g->table);
    assert_non_null(g->sync);
    make_rec(&g->rec, name, tag, pin, pout);
    route_sync_set_local(g->sync, &g->rec);
}

static void gw_stop(gateway *g)
{
    route_sync_free(g->sync);
    g->sync = NULL;
    route_table_free(g->table);
    g->table = NULL;
}

/* Writes to Redis on a timer of the test's loop, as a gateway of another
 * kind would: fields (printf-style, %lld the wall clock in ms; NULL: an
 * entry of a form this version cannot read) to a key, then PEXPIRE and
 * PUBLISH. */
typedef struct writer {
    struct event *ev;
    const char *key, *fields, *region;
} writer;

static void on_writer(evutil_socket_t fd, short what, void *arg)
{
    writer *w = arg;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    char cmd[2048];
    if (w->fields) { /* the fields are arguments of their own: the whole line is the format */
        char fields[1536];
        snprintf(fields, sizeof(fields), w->fields, now);
        snprintf(cmd, sizeof(cmd), "HSET %s %s", w->key, fields);
        freeReplyObject(rc_command(cmd));
    } else { /* an entry of 70 lines */
        size_t at = 0;
        for (int i = 0; i < 70; i++)
            at += (size_t)snprintf(cmd + at, sizeof(cmd) - at, "x%d=%lld\n", i, now);
        freeReplyObject(rc_command("HSET %s instance:00000000000000ff %b", w->key, cmd, at));
    }
    freeReplyObject(rc_command("PEXPIRE %s 600", w->key));
    freeReplyObject(rc_command("PUBLISH infergate:" CLUSTER ":events %s", w->region));
}

static void writer_start(writer *w, const char *key, const char *fields, const char *region)
{
    w->key = key;
    w->fields = fields;
    w->region = region;
    w->ev = event_new(base, -1, EV_PERSIST, on_writer, w);
    struct timeval tv = {0, 200000};
    event_add(w->ev, &tv);
}

static void writer_stop(writer *w)
{
    if (w->ev)
        event_free(w->ev);
    w->ev = NULL;
}

/* Static, so that teardown stops them when a test fails. */
static writer w_old, w_entry;

static int setup(void **state)
{
    if (!redis_pid && redis_start())
        return -1;
    redisReply *r = rc_command("FLUSHALL");
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    memset(&ga, 0, sizeof(ga));
    memset(&gb, 0, sizeof(gb));
    memset(&gc, 0, sizeof(gc));
    return ok ? 0 : -1;
}

static int teardown(void **state)
{
    writer_stop(&w_old);
    writer_stop(&w_entry);
    gw_stop(&ga);
    gw_stop(&gb);
    gw_stop(&gc);
    if (redis_pid) {
        kill(redis_pid, SIGCONT);
        freeReplyObject(rc_command("REPLICAOF NO ONE"));          /* after test_redis_refuses_writes */
        freeReplyObject(rc_command("ACL SETUSER default +@all")); /* after test_script_refused */
    }
    run_for(1);
    return 0;
}

static const route_region *region(gateway *g, const char *name)
{
    return route_table_find(g->table, name);
}

static double price_in_of(gateway *g, const char *name)
{
    const route_region *r = region(g, name);
    return r ? r->rec.price_in : -1;
}

static bool published_price_in_is(const char *name, const char *want)
{
    redisReply *r = rc_command("HGET infergate:" CLUSTER ":region:%s price_in", name);
    bool ok = r && r->type == REDIS_REPLY_STRING && !strcmp(r->str, want);
    freeReplyObject(r);
    return ok;
}

static void start_pair(const route_sync_opts *o)
{
    gw_start(&ga, o, "eu-west", "eu", 3.0, 6.0);
    gw_start(&gb, o, "us-east", "us", 1.0, 2.0);
    WAIT_UNTIL(route_sync_connected(ga.sync) && route_sync_connected(gb.sync));
    WAIT_UNTIL(region(&ga, "us-east") && region(&gb, "eu-west"));
}

/* ---- tests ---- */

static void test_two_gateways(void **state)
{
    route_sync_opts o;
    test_opts(&o);
    start_pair(&o);

    const route_region *r = region(&ga, "us-east");
    assert_false(r->local);
    assert_string_equal(r->rec.endpoint, gb.rec.endpoint);
    assert_int_equal(r->rec.n_models, 2);
    assert_string_equal(r->rec.models[1], "tiny-chat");
    assert_int_equal(r->rec.n_tags, 1);
    assert_string_equal(r->rec.tags[0], "us");
    assert_true(r->rec.price_in == 1.0 && r->rec.price_out == 2.0);
    assert_true(r->rec.healthy);
    assert_true(r->rec.updated_ms > 0);
    assert_true(region(&ga, "eu-west")->local);
    assert_true(route_sync_last_ok_ms(ga.sync) > 0);

    /* The key carries all fields and a TTL of a few heartbeats. */
    long long ttl = rc_integer("PTTL %s", "infergate:" CLUSTER ":region:us-east");
    assert_true(ttl > 0 && ttl <= 600);

    /* An identity change is announced at once (the full read is a minute
     * away): a health change reaches the peer. */
    gb.rec.healthy = false;
    route_sync_set_local(gb.sync, &gb.rec);
    WAIT_UNTIL(!region(&ga, "us-east")->rec.healthy);

    /* A material load change goes out with the next heartbeat. */
    gb.rec.queued = 5;
    route_sync_set_local(gb.sync, &gb.rec);
    WAIT_UNTIL(region(&ga, "us-east")->rec.queued == 5);

    /* So does one model's, while the region's totals hold still: routing
     * ranks by the model's. */
    gb.rec.capacity = 65;
    gb.rec.running = 0;
    gb.rec.queued = 1;
    gb.rec.n_load = 2;
    gb.rec.load[0] = (route_model_load){64, 0, 1, 10, 1};
    gb.rec.load[1] = (route_model_load){1, 0, 0, 10, 1};
    route_sync_set_local(gb.sync, &gb.rec);
    WAIT_UNTIL(region(&ga, "us-east")->rec.n_load == 2 && region(&ga, "us-east")->rec.capacity == 65);
    gb.rec.load[0].queued = 0;
    gb.rec.load[1].queued = 1;
    route_sync_set_local(gb.sync, &gb.rec);
    WAIT_UNTIL(region(&ga, "us-east")->rec.load[1].queued == 1);

    /* A live peer stays fresh across heartbeats. */
    run_for(400);
    assert_true(route_region_fresh(ga.table, region(&ga, "us-east"), gw_mono_ms()));
}

static void test_set_price(void **state)
{
    route_sync_opts o;
    test_opts(&o);
    start_pair(&o);

    char err[256];
    int64_t t0 = mono_ms();
    assert_int_equal(route_set_price(&o, "us-east", 1.5, 2.5, err, sizeof(err)), 0);
    assert_string_equal(err, "");
    /* Only the PUBLISH can deliver it this soon: the full read is minutes away. */
    WAIT_UNTIL(price_in_of(&ga, "us-east") == 1.5);
    printf("# set-price seen by the peer after %lld ms\n", (long long)(mono_ms() - t0));
    assert_true(region(&ga, "us-east")->rec.price_out == 2.5);
    /* The owner adopts it for its own region, and publishes it as its own. */
    WAIT_UNTIL(price_in_of(&gb, "us-east") == 1.5);
    assert_true(region(&gb, "us-east")->local);
    WAIT_UNTIL(published_price_in_is("us-east", "1.5"));
    /* A later set_local with the configured price keeps the override. */
    gb.rec.running = 1;
    route_sync_set_local(gb.sync, &gb.rec);
    run_for(300);
    assert_true(price_in_of(&gb, "us-east") == 1.5);
    assert_true(price_in_of(&ga, "us-east") == 1.5);

    /* A region that does not publish: stored, with a warning. */
    assert_int_equal(route_set_price(&o, "ap-south", 1, 1, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "ap-south"));

    /* Errors. */
    assert_int_equal(route_set_price(&o, "bad name", 1, 1, err, sizeof(err)), -EINVAL);
    assert_int_equal(route_set_price(&o, "us-east", -1, 1, err, sizeof(err)), -EINVAL);
    assert_int_equal(route_set_price(&o, "us-east", 1, 2e9, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "from 0 to"));

    /* An override no record may carry, written by hand: ignored, the
     * region keeps its own price and stays in the table. */
    assert_int_equal(rc_integer("HSET %s input 2e9 output 0x10", "infergate:" CLUSTER ":price:us-east"), 0);
    assert_true(rc_integer("PUBLISH %s us-east", "infergate:" CLUSTER ":events") >= 1);
    WAIT_UNTIL(price_in_of(&ga, "us-east") == 1.0 && price_in_of(&gb, "us-east") == 1.0);
    run_for(300);
    assert_true(route_region_fresh(ga.table, region(&ga, "us-east"), gw_mono_ms()));
    /* A field of someone else's beside a good override: the override holds. */
    assert_true(rc_integer("HSET %s input 3 output 4 note by-ops", "infergate:" CLUSTER ":price:us-east") >=
                0);
    assert_true(rc_integer("PUBLISH %s us-east", "infergate:" CLUSTER ":events") >= 1);
    WAIT_UNTIL(price_in_of(&ga, "us-east") == 3 && price_in_of(&gb, "us-east") == 3);
    /* The override key written with SET where HSET was meant: no override,
     * said, and the store still trusted (its writes succeed). */
    freeReplyObject(rc_command("DEL %s", "infergate:" CLUSTER ":price:us-east"));
    freeReplyObject(rc_command("SET %s 0.4", "infergate:" CLUSTER ":price:us-east"));
    assert_true(rc_integer("PUBLISH %s us-east", "infergate:" CLUSTER ":events") >= 1);
    WAIT_UNTIL(price_in_of(&gb, "us-east") == 1.0);
    run_for(600);
    assert_true(route_table_shared_ok(gb.table));
    assert_non_null(strstr(route_sync_last_error(gb.sync), "price override"));
    route_sync_opts bad = o;
    bad.password = "wrong";
    assert_int_equal(route_set_price(&bad, "us-east", 1, 1, err, sizeof(err)), -EACCES);
    bad = o;
    bad.port = free_port();
    assert_int_equal(route_set_price(&bad, "us-east", 1, 1, err, sizeof(err)), -ECONNREFUSED);
    char want[64];
    snprintf(want, sizeof(want), "cannot reach Redis at 127.0.0.1:%d", bad.port);
    assert_non_null(strstr(err, want));
}

/* Records and price overrides under fleet keys (routing/record_auth.h): a
 * gateway signs what it writes, and takes from Redis only what one of its
 * keys proves. */
#define FLEET_KEY_1 "fleet-key-one-0123456789abcdef-0123456789"
#define FLEET_KEY_2 "fleet-key-two-0123456789abcdef-0123456789"

static void keys_of(route_auth_keys *k, const char *first, const char *second)
{
    const char *v[] = {first, second};
    char err[160];
    assert_int_equal(route_auth_keys_set(k, v, second ? 2 : 1, err, sizeof(err)), 0);
}

static void test_fleet_keys(void **state)
{
    route_sync_opts o;
    test_opts(&o);
    o.full_read_ms = 300; /* a rotation is seen at the next full read */
    keys_of(&o.auth, FLEET_KEY_1, NULL);
    start_pair(&o);
    /* The proof is in the plain fields and in the entry. */
    redisReply *r = rc_command("HGET infergate:" CLUSTER ":region:us-east auth");
    assert_true(r && r->type == REDIS_REPLY_STRING && !strncmp(r->str, "v1:", 3) && r->len == 67);
    freeReplyObject(r);

    /* A region written to Redis by hand never enters a table: said and counted. */
    const char *last;
    freeReplyObject(rc_command("HSET infergate:" CLUSTER ":region:rogue endpoint tls:127.0.0.1:9 models tiny "
                               "tags eu price_in 0 price_out 0 healthy 1 updated_ms 1"));
    assert_true(rc_integer("PUBLISH %s rogue", "infergate:" CLUSTER ":events") >= 1);
    WAIT_UNTIL(route_sync_auth_refused(ga.sync, &last) > 0);
    assert_non_null(strstr(last, "record of region rogue: no auth field"));
    assert_null(region(&ga, "rogue"));
    /* A proof copied from another region's record proves nothing here. */
    r = rc_command("HGET infergate:" CLUSTER ":region:us-east auth");
    assert_true(r && r->type == REDIS_REPLY_STRING);
    freeReplyObject(rc_command("HSET infergate:" CLUSTER ":region:rogue auth %s", r->str));
    freeReplyObject(r);
    unsigned long long before = route_sync_auth_refused(ga.sync, NULL);
    assert_true(rc_integer("PUBLISH %s rogue", "infergate:" CLUSTER ":events") >= 1);
    WAIT_UNTIL(route_sync_auth_refused(ga.sync, &last) > before);
    assert_non_null(strstr(last, "does not match the fleet keys"));
    assert_null(region(&ga, "rogue"));

    /* A price override written by hand is ignored; route_set_price signs its own. */
    before = route_sync_auth_refused(ga.sync, NULL);
    assert_true(rc_integer("HSET %s input 0.01 output 0.01", "infergate:" CLUSTER ":price:us-east") >= 0);
    assert_true(rc_integer("PUBLISH %s us-east", "infergate:" CLUSTER ":events") >= 1);
    WAIT_UNTIL(route_sync_auth_refused(ga.sync, &last) > before);
    assert_non_null(strstr(last, "price override of region us-east"));
    assert_true(price_in_of(&ga, "us-east") == 1.0);
    char err[256];
    assert_int_equal(route_set_price(&o, "us-east", 1.5, 2.5, err, sizeof(err)), 0);
    WAIT_UNTIL(price_in_of(&ga, "us-east") == 1.5 && price_in_of(&gb, "us-east") == 1.5);

    /* A gateway of another key: neither side takes the other's record. */
    route_sync_opts o2 = o;
    keys_of(&o2.auth, FLEET_KEY_2, NULL);
    gw_start(&gc, &o2, "ap-south", "ap", 2.0, 2.0);
    WAIT_UNTIL(route_sync_connected(gc.sync));
    run_for(600);
    assert_null(region(&gc, "eu-west"));
    assert_null(region(&ga, "ap-south"));
    /* A rotation: with both keys, each takes the other's. */
    route_auth_keys both;
    keys_of(&both, FLEET_KEY_1, FLEET_KEY_2);
    route_sync_set_auth(ga.sync, &both);
    keys_of(&both, FLEET_KEY_2, FLEET_KEY_1);
    route_sync_set_auth(gc.sync, &both);
    WAIT_UNTIL(region(&ga, "ap-south") && region(&gc, "eu-west") && region(&gc, "us-east"));
}

static void test_full_read_and_ttl(void **state)
{
    route_sync_opts o;
    test_opts(&o);
    o.full_read_ms = 300;
    start_pair(&o);

    /* A record written without an announcement arrives by the full read. */
    redisReply *r =
        rc_command("HSET infergate:" CLUSTER ":region:ap-south endpoint tls:127.0.0.1:9100 models tiny "
                   "tags ap price_in 0.5 price_out 0.7 gpu h100 capacity 4 running 0 queued 0 ttft_ms 1 "
                   "tpot_ms 1 healthy 1 updated_ms 7");
    assert_non_null(r);
    freeReplyObject(r);
    WAIT_UNTIL(region(&ga, "ap-south") && region(&gb, "ap-south"));
    assert_true(region(&ga, "ap-south")->rec.price_in == 0.5);

    /* A malformed record is refused with a reason and changes nothing. */
    r = rc_command("HSET infergate:" CLUSTER ":region:bad-one price_in abc");
    freeReplyObject(r);
    WAIT_UNTIL(strstr(route_sync_last_error(ga.sync), "bad-one") != NULL);
    assert_null(region(&ga, "bad-one"));
    r = rc_command("DEL infergate:" CLUSTER ":region:bad-one infergate:" CLUSTER ":region:ap-south");
    freeReplyObject(r);

    /* A stopped publisher: its key expires, the peer keeps the last record,
     * which goes stale on the table's clock. */
    gw_stop(&gb);
    WAIT_UNTIL(rc_integer("EXISTS %s", "infergate:" CLUSTER ":region:us-east") == 0);
    run_for(700); /* two more full reads */
    const route_region *us = region(&ga, "us-east");
    assert_non_null(us);
    assert_string_equal(us->rec.tags[0], "us");
    WAIT_UNTIL(!route_region_fresh(ga.table, region(&ga, "us-east"), gw_mono_ms()));
    assert_non_null(region(&ga, "us-east"));
    assert_true(route_region_fresh(ga.table, region(&ga, "eu-west"), gw_mono_ms())); /* local */
}

static int n_allowed, n_limited, n_notconn, n_answers;
static int last_retry_ms;

static void on_limit(void *ud, int result, int retry_after_ms)
{
    n_answers++;
    if (result == 0)
        n_allowed++;
    else if (result == -EAGAIN) {
        n_limited++;
        last_retry_ms = retry_after_ms;
    } else if (result == -ENOTCONN)
        n_notconn++;
}

static void limit_burst(int n)
{
    n_allowed = n_limited = n_notconn = n_answers = 0;
    for (int i = 0; i < n; i++)
        assert_int_equal(route_sync_limit(i % 2 ? gb.sync : ga.sync, "tenant-a", 5, 5, 1, on_limit, NULL), 0);
    WAIT_UNTIL(n_answers == n);
}

static void test_gcra(void **state)
{
    route_sync_opts o;
    test_opts(&o);
    start_pair(&o);

    /* 5/s with a burst of 5, from two gateways together. */
    limit_burst(20);
    printf("# first burst: %d allowed, %d limited\n", n_allowed, n_limited);
    assert_int_equal(n_notconn, 0);
    assert_in_range(n_allowed, 4, 6);
    assert_int_equal(n_allowed + n_limited, 20);
    assert_in_range(last_retry_ms, 1, 1000);

    run_for(1000);
    limit_burst(20);
    printf("# after 1 s: %d allowed, %d limited\n", n_allowed, n_limited);
    assert_in_range(n_allowed, 4, 6);

    /* The script cache flushed: NOSCRIPT, reloaded, answered. */
    redisReply *r = rc_command("SCRIPT FLUSH");
    freeReplyObject(r);
    n_allowed = n_limited = n_notconn = n_answers = 0;
    assert_int_equal(route_sync_limit(ga.sync, "tenant-b", 100, 10, 1, on_limit, NULL), 0);
    WAIT_UNTIL(n_answers == 1);
    assert_int_equal(n_allowed, 1);

    /* A cancelled request's answer is dropped; replies come in order, so
     * once the second is answered the first was too. */
    static int cancelled_token;
    n_answers = 0;
    assert_int_equal(route_sync_limit(ga.sync, "tenant-b", 100, 10, 1, on_limit, &cancelled_token), 0);
    route_sync_limit_cancel(ga.sync, &cancelled_token);
    assert_int_equal(route_sync_limit(ga.sync, "tenant-b", 100, 10, 1, on_limit, NULL), 0);
    WAIT_UNTIL(n_answers == 1);
    run_for(50);
    assert_int_equal(n_answers, 1);

    /* Bad arguments. */
    assert_int_equal(route_sync_limit(ga.sync, "k", 0, 5, 1, on_limit, NULL), -EINVAL);
    assert_int_equal(route_sync_limit(ga.sync, "k", 5, -1, 1, on_limit, NULL), -EINVAL);
    assert_int_equal(route_sync_limit(ga.sync, "k", 5, 5, 0, on_limit, NULL), -EINVAL);
    assert_int_equal(route_sync_refund(ga.sync, "k", 5, 5, 0), -EINVAL);
    assert_int_equal(route_sync_refund(ga.sync, "k", 0, 5, 1), -EINVAL);
}

/* One answer to a single check of cost against a rate of one unit per 10 s
 * (slow enough that no unit comes back while a test runs), burst 100. */
#define SLOW_RATE 0.1

static int limit_one(const char *key, double cost)
{
    n_allowed = n_limited = n_notconn = n_answers = 0;
    assert_int_equal(route_sync_limit(ga.sync, key, SLOW_RATE, 100, cost, on_limit, NULL), 0);
    WAIT_UNTIL(n_answers == 1);
    return n_allowed ? 0 : n_limited ? -EAGAIN : -ENOTCONN;
}

/* Tokens per minute: a request may cost more than the whole burst, and
 * what the estimate over-charged comes back. */
static void test_gcra_debt_and_refund(void **state)
{
    route_sync_opts o;
    test_opts(&o);
    start_pair(&o);

    /* More than the burst: admitted on a full bucket, which then fills
     * again in 6000 s (600 units); the next waits for full. Before, such
     * a request was refused for ever. */
    assert_int_equal(limit_one("big", 600), 0);
    assert_int_equal(limit_one("big", 600), -EAGAIN);
    assert_in_range(last_retry_ms, 5990000, 6000000);
    assert_int_equal(limit_one("big", 1), -EAGAIN);

    /* The whole burst taken: refused; 40 given back: 40 more fit, not 41. */
    assert_int_equal(limit_one("refunded", 100), 0);
    assert_int_equal(limit_one("refunded", 20), -EAGAIN);
    assert_int_equal(route_sync_refund(ga.sync, "refunded", SLOW_RATE, 100, 40), 0);
    assert_int_equal(limit_one("refunded", 39), 0);
    assert_int_equal(limit_one("refunded", 2), -EAGAIN);

    /* A refund never fills past full. */
    assert_int_equal(route_sync_refund(ga.sync, "fresh", SLOW_RATE, 100, 1000), 0);
    assert_int_equal(limit_one("fresh", 100), 0);
    assert_int_equal(limit_one("fresh", 5), -EAGAIN);

    /* A charge after the fact (a completion longer than its estimate)
     * is taken without asking, into debt: 30 charged on 50 taken leaves
     * 20, and a charge past empty makes the next request wait longer. */
    assert_int_equal(route_sync_charge(ga.sync, "charged", SLOW_RATE, 100, 0), -EINVAL);
    assert_int_equal(limit_one("charged", 50), 0);
    assert_int_equal(route_sync_charge(ga.sync, "charged", SLOW_RATE, 100, 30), 0);
    assert_int_equal(limit_one("charged", 20), 0);
    assert_int_equal(limit_one("charged", 1), -EAGAIN);
    assert_int_equal(route_sync_charge(ga.sync, "charged", SLOW_RATE, 100, 500), 0);
    assert_int_equal(limit_one("charged", 1), -EAGAIN);
    assert_in_range(last_retry_ms, 5000000, 5020000); /* 500 units of debt at 0.1/s */

    /* The Redis host's clock stepped back 60 s since the last check, which
     * left the bucket 5 units (50 s) past empty: the next unit waits 60 s
     * for that, not 60 s more for the step. */
    redisReply *tm = rc_command("TIME");
    assert_true(tm && tm->type == REDIS_REPLY_ARRAY && tm->elements == 2);
    double now = atof(tm->element[0]->str) * 1000 + atof(tm->element[1]->str) / 1000;
    freeReplyObject(tm);
    char val[64], at[64];
    snprintf(val, sizeof(val), "%.3f", now + 60000 + 1000000 + 50000);
    snprintf(at, sizeof(at), "%.3f", now + 60000);
    freeReplyObject(rc_command("SET %s %s PX 600000", "infergate:" CLUSTER ":limit:stepped", val));
    freeReplyObject(rc_command("SET %s %s PX 600000", "infergate:" CLUSTER ":limit-at:stepped", at));
    assert_int_equal(limit_one("stepped", 1), -EAGAIN);
    assert_in_range(last_retry_ms, 59000, 61000); /* was 120 s */

    /* The TAT stays a plain number, as gateways before the step handling
     * read it: a rolling upgrade shares the buckets. */
    assert_int_equal(limit_one("plain", 1), 0);
    redisReply *v = rc_command("GET %s", "infergate:" CLUSTER ":limit:plain");
    assert_true(v && v->type == REDIS_REPLY_STRING);
    char *end;
    strtod(v->str, &end);
    assert_true(end != v->str && *end == '\0');
    freeReplyObject(v);
}

static void test_redis_stopped(void **state)
{
    route_sync_opts o;
    test_opts(&o);
    start_pair(&o);

    /* Hung server: a request in flight misses its deadline and answers
     * -ENOTCONN; the connection is dropped; the records stay. */
    assert_int_equal(kill(redis_pid, SIGSTOP), 0);
    n_allowed = n_limited = n_notconn = n_answers = 0;
    assert_int_equal(route_sync_limit(ga.sync, "tenant-a", 5, 5, 1, on_limit, NULL), 0);
    WAIT_UNTIL(n_answers == 1);
    assert_int_equal(n_notconn, 1);
    WAIT_UNTIL(!route_sync_connected(ga.sync) && !route_sync_connected(gb.sync));
    assert_non_null(strstr(route_sync_last_error(ga.sync), "did not answer"));
    assert_false(route_table_shared_ok(ga.table));
    assert_int_equal(route_sync_limit(ga.sync, "tenant-a", 5, 5, 1, on_limit, NULL), -ENOTCONN);
    run_for(500); /* reconnects hang too and are dropped */
    assert_false(route_sync_connected(ga.sync));
    assert_non_null(region(&ga, "us-east"));
    assert_non_null(region(&gb, "eu-west"));

    /* Resumed: back, and a change made while away arrives. */
    gb.rec.price_out = 9;
    route_sync_set_local(gb.sync, &gb.rec);
    assert_int_equal(kill(redis_pid, SIGCONT), 0);
    WAIT_UNTIL(route_sync_connected(ga.sync) && route_sync_connected(gb.sync));
    WAIT_UNTIL(region(&ga, "us-east")->rec.price_out == 9);

    /* Killed: connections refused, records kept, then a new empty server on
     * the same port: both publish and read again. */
    redis_kill();
    WAIT_UNTIL(!route_sync_connected(ga.sync) && !route_sync_connected(gb.sync));
    run_for(300);
    assert_non_null(region(&ga, "us-east"));
    int64_t before = region(&ga, "us-east")->rec.updated_ms;
    assert_int_equal(route_sync_limit(gb.sync, "tenant-a", 5, 5, 1, on_limit, NULL), -ENOTCONN);
    assert_int_equal(redis_start(), 0);
    WAIT_UNTIL(route_sync_connected(ga.sync) && route_sync_connected(gb.sync));
    WAIT_UNTIL(rc_integer("EXISTS %s", "infergate:" CLUSTER ":region:us-east") == 1 &&
               rc_integer("EXISTS %s", "infergate:" CLUSTER ":region:eu-west") == 1);
    WAIT_UNTIL(region(&ga, "us-east")->rec.updated_ms > before);
    WAIT_UNTIL(route_table_shared_ok(ga.table));
    n_answers = 0;
    assert_int_equal(route_sync_limit(gb.sync, "tenant-a", 5, 5, 1, on_limit, NULL), 0);
    WAIT_UNTIL(n_answers == 1);
}

/* A Redis that refuses scripting (here an ACL user without it) shares
 * records all the same; rate limits are left to each gateway's local
 * bucket, and the last error says why. */
static void test_script_refused(void **state)
{
    redisReply *r = rc_command("ACL SETUSER default -@scripting");
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    assert_true(ok);
    route_sync_opts o;
    test_opts(&o);
    start_pair(&o); /* records both ways */
    assert_non_null(strstr(route_sync_last_error(ga.sync), "refused SCRIPT LOAD (NOPERM"));
    assert_int_equal(route_sync_limit(ga.sync, "tenant-s", 100, 10, 1, on_limit, NULL), -ENOTCONN);
    run_for(300); /* not dropped and set up again: still connected, the error unchanged */
    assert_true(route_sync_connected(ga.sync));
    assert_non_null(strstr(route_sync_last_error(ga.sync), "refused SCRIPT LOAD (NOPERM"));
}

/* A Redis that answers but refuses writes (a replica after a failover:
 * READONLY): the table's clock stops as for a lost one, so peers' records,
 * which no one can refresh, stay candidates; trusted again once writes go
 * through and a full read has. */
static void test_redis_refuses_writes(void **state)
{
    route_sync_opts o;
    test_opts(&o);
    o.full_read_ms = 300;
    start_pair(&o);
    WAIT_UNTIL(route_table_shared_ok(ga.table) && route_table_shared_ok(gb.table));

    redisReply *r = rc_command("REPLICAOF 127.0.0.1 1"); /* a master that is not there */
    assert_true(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    WAIT_UNTIL(!route_table_shared_ok(ga.table) && !route_table_shared_ok(gb.table));
    assert_non_null(strstr(route_sync_last_error(ga.sync), "writing the record"));
    assert_true(route_sync_connected(ga.sync));
    run_for(600); /* full reads in the meantime do not make it trusted */
    assert_false(route_table_shared_ok(ga.table));
    assert_non_null(region(&ga, "us-east"));

    r = rc_command("REPLICAOF NO ONE");
    assert_true(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    WAIT_UNTIL(route_table_shared_ok(ga.table) && route_table_shared_ok(gb.table));
    WAIT_UNTIL(route_region_fresh(ga.table, region(&ga, "us-east"), gw_mono_ms()));
}

static long long connections_received(redisContext *c)
{
    redisReply *r = redisCommand(c, "INFO stats");
    const char *at =
        r && r->type == REDIS_REPLY_STRING ? strstr(r->str, "total_connections_received:") : NULL;
    long long n = at ? atoll(at + strlen("total_connections_received:")) : -1;
    freeReplyObject(r);
    return n;
}

/* A connection that Redis (or a proxy) closes right after its setup is
 * reopened on a growing back-off, not every reconnect_min_ms: the back-off
 * starts over only for a connection that stayed up. */
static void test_reconnect_backoff(void **state)
{
    route_sync_opts o;
    test_opts(&o); /* back-off 50 .. 400 ms */
    gw_start(&ga, &o, "us-east", "us", 1, 2);
    WAIT_UNTIL(route_table_shared_ok(ga.table));
    redisContext *killer = rc_connect();
    assert_non_null(killer);
    long long before = connections_received(killer);
    /* 2 s of every client but ours killed every 20 ms: on a back-off reset
     * at each setup, each of the two connections came back ~30 times. The
     * 2 s are timed, not counted in turns: on a slow machine 100 turns
     * took longer, and a longer run reconnects more. */
    for (int64_t t0 = mono_ms(); mono_ms() - t0 < 2000;) {
        run_for(20);
        freeReplyObject(redisCommand(killer, "CLIENT KILL TYPE normal SKIPME yes"));
        freeReplyObject(redisCommand(killer, "CLIENT KILL TYPE pubsub"));
    }
    long long reconnects = connections_received(killer) - before;
    redisFree(killer);
    assert_true(before >= 0);
    if (reconnects > 24)
        fail_msg("%lld reconnections in 2 s on a 50..400 ms back-off", reconnects);
    WAIT_UNTIL(route_table_shared_ok(ga.table)); /* and back once left alone */
    gw_stop(&ga);
}

static const route_region *merged_eu(void)
{
    const route_region *r = region(&gb, "eu-west");
    return r && r->rec.instances >= 1 ? r : NULL;
}

static long long eu_hash_len(void)
{
    return rc_integer("HLEN %s", "infergate:" CLUSTER ":region:eu-west");
}

/* Gateways behind one load balancer share a region name: each writes its
 * entry in the region's hash, a peer merges the entries, and the entry of
 * a gateway that stops is removed by the others. */
static void test_shared_region_name(void **state)
{
    route_sync_opts o;
    test_opts(&o);
    start_pair(&o);
    WAIT_UNTIL(merged_eu() && merged_eu()->rec.instances == 1);
    assert_int_equal(eu_hash_len(), ROUTE_N_FIELDS + 1); /* the plain fields, and one entry */

    gw_start(&gc, &o, "eu-west", "eu", 3.0, 7.0);
    gc.rec.capacity = 24;
    gc.rec.running = 5;
    gc.rec.ttft_ms = 60;
    snprintf(gc.rec.tags[1], sizeof(gc.rec.tags[1]), "gdpr");
    gc.rec.n_tags = 2;
    gc.rec.n_models = 1;
    route_sync_set_local(gc.sync, &gc.rec);
    WAIT_UNTIL(merged_eu()->rec.instances == 2 && merged_eu()->rec.capacity == 32);
    const route_record *m = &merged_eu()->rec;
    assert_true(m->healthy);
    assert_int_equal(m->running, 5);
    assert_true(m->ttft_ms == (8 * 20 + 24 * 60) / 32.0);
    assert_true(m->price_out == 7.0);
    assert_int_equal(m->n_models, 1); /* what both serve */
    assert_string_equal(m->models[0], "tiny");
    assert_int_equal(m->n_tags, 1);
    /* each gateway's own view of its region is its own */
    assert_true(region(&ga, "eu-west")->local);
    assert_int_equal(region(&ga, "eu-west")->rec.capacity, 8);

    /* One draining: the region stays healthy on the other's load alone
     * (a record per region had turned it unhealthy for its peers). */
    gc.rec.healthy = false;
    route_sync_set_local(gc.sync, &gc.rec);
    WAIT_UNTIL(merged_eu()->rec.instances == 1);
    assert_true(merged_eu()->rec.healthy);
    assert_int_equal(merged_eu()->rec.capacity, 8);
    assert_int_equal(merged_eu()->rec.n_models, 2);

    /* One that stops: the other removes its entry after a TTL, and the
     * region stays fresh. */
    assert_int_equal(eu_hash_len(), ROUTE_N_FIELDS + 2);
    gw_stop(&gc);
    WAIT_UNTIL(eu_hash_len() == ROUTE_N_FIELDS + 1);
    assert_true(route_region_fresh(gb.table, region(&gb, "eu-west"), gw_mono_ms()));

    /* A gateway started again is a new id: its previous entry goes the
     * same way. */
    gw_stop(&ga);
    gw_start(&ga, &o, "eu-west", "eu", 3.0, 6.0);
    WAIT_UNTIL(route_sync_connected(ga.sync));
    WAIT_UNTIL(eu_hash_len() == ROUTE_N_FIELDS + 2);
    WAIT_UNTIL(eu_hash_len() == ROUTE_N_FIELDS + 1);
    WAIT_UNTIL(merged_eu()->rec.instances == 1);
    assert_true(merged_eu()->rec.healthy);
}

/* The pair, and gc under the name given. */
static void start_three(route_sync_opts *o, const char *name, const char *tag)
{
    test_opts(o);
    start_pair(o);
    gw_start(&gc, o, name, tag, 3.0, 6.0);
}

static bool eu_has_two_entries(void)
{
    return eu_hash_len() == ROUTE_N_FIELDS + 2;
}

/* A Redis that stood still for longer than a TTL: when it is back, nobody's
 * silence is known, and no gateway removes a live one's entry. Nor one
 * whose entry it cannot read but sees being written. */
static void test_shared_name_faults(void **state)
{
    route_sync_opts o;
    start_three(&o, "eu-west", "eu");
    WAIT_UNTIL(eu_has_two_entries() && merged_eu() && merged_eu()->rec.instances == 2);

    assert_int_equal(kill(redis_pid, SIGSTOP), 0);
    run_for(1000); /* the TTL is 600 ms */
    assert_int_equal(kill(redis_pid, SIGCONT), 0);
    WAIT_UNTIL(route_sync_connected(ga.sync) && route_sync_connected(gc.sync));
    for (int i = 0; i < 30; i++) { /* five TTLs */
        run_for(100);
        if (!eu_has_two_entries())
            fail_msg("a live gateway's entry was removed after Redis came back (%lld fields)", eu_hash_len());
    }
    gw_stop(&gc);

    /* An entry of a newer kind (more lines than this version reads), written on. */
    writer_start(&w_entry, "infergate:" CLUSTER ":region:eu-west", NULL, "eu-west");
    WAIT_UNTIL(rc_integer("HEXISTS %s instance:00000000000000ff", "infergate:" CLUSTER ":region:eu-west") ==
               1);
    for (int i = 0; i < 30; i++) {
        run_for(100);
        if (rc_integer("HEXISTS %s instance:00000000000000ff", "infergate:" CLUSTER ":region:eu-west") != 1)
            fail_msg("an entry being written, though unreadable here, was removed");
    }
    writer_stop(&w_entry);
    assert_true(merged_eu()->rec.healthy);
}

/* A region whose only writer left is a gateway from before entries: its
 * plain fields are read, not the entry a newer gateway of the region left
 * (nobody removes it: the old writer keeps the key alive). */
static void test_shared_name_old_writer(void **state)
{
    route_sync_opts o;
    start_three(&o, "ap-south", "ap");
    WAIT_UNTIL(region(&gb, "ap-south") && region(&gb, "ap-south")->rec.instances == 1);
    gc.rec.healthy = false; /* drained */
    route_sync_set_local(gc.sync, &gc.rec);
    WAIT_UNTIL(!region(&gb, "ap-south")->rec.healthy);
    gw_stop(&gc);

    writer_start(&w_old, "infergate:" CLUSTER ":region:ap-south",
                 "endpoint tls:127.0.0.1:9200 models tiny tags ap price_in 1 price_out 1 gpu cpu capacity 5 "
                 "running 0 queued 0 ttft_ms 1 tpot_ms 1 healthy 1 updated_ms %lld",
                 "ap-south");
    WAIT_UNTIL(region(&gb, "ap-south")->rec.healthy && region(&gb, "ap-south")->rec.capacity == 5);
    for (int i = 0; i < 20; i++) {
        run_for(100);
        const route_region *r = region(&gb, "ap-south");
        if (!r->rec.healthy || r->rec.capacity != 5 || !route_region_fresh(gb.table, r, gw_mono_ms()))
            fail_msg("ap-south, written by a gateway from before entries, read as %s, capacity %d%s",
                     r->rec.healthy ? "healthy" : "unhealthy", r->rec.capacity,
                     route_region_fresh(gb.table, r, gw_mono_ms()) ? "" : ", stale");
    }
    assert_int_equal(rc_integer("HLEN %s", "infergate:" CLUSTER ":region:ap-south"), ROUTE_N_FIELDS + 1);
    writer_stop(&w_old);
}

/* `infergate region set-price`, explicit flags and from a gateway config. */
static void test_cli(void **state)
{
    char port_arg[32], path[64];
    snprintf(port_arg, sizeof(port_arg), "127.0.0.1:%d", redis_port);
    char *argv1[] = {"region", "set-price", "us-east", "--input",   "0.25",  "--output",   "0.5", "--redis",
                     port_arg, "--db",      "3",       "--cluster", CLUSTER, "--password", PASS,  NULL};
    /* No fleet key: an unsigned price every gateway would ignore is not written. */
    unsetenv("INFERGATE_RECORD_KEY");
    assert_int_equal(gw_cmd_region(15, argv1), 1);
    setenv("INFERGATE_RECORD_KEY", "0123456789abcdef0123456789abcdef", 1);
    assert_int_equal(gw_cmd_region(15, argv1), 0);
    unsetenv("INFERGATE_RECORD_KEY");
    redisReply *r = rc_command("HGET infergate:" CLUSTER ":price:us-east input");
    assert_true(r && r->type == REDIS_REPLY_STRING && !strcmp(r->str, "0.25"));
    freeReplyObject(r);

    snprintf(path, sizeof(path), "/tmp/infergate-test-sync-%d.yaml", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "region:\n  name: eu-west\ncluster: %s\nredis:\n  address: \"127.0.0.1:%d\"\n  password: %s\n"
            "  db: %d\n  record_keys: [0123456789abcdef0123456789abcdef]\n",
            CLUSTER, redis_port, PASS, DB);
    fclose(f);
    char *argv2[] = {"region",   "set-price", "us-east",  "--input", "4",
                     "--output", "8",         "--config", path,      NULL};
    int rc = gw_cmd_region(9, argv2);
    unlink(path);
    assert_int_equal(rc, 0);
    r = rc_command("HGET infergate:" CLUSTER ":price:us-east output");
    assert_true(r && r->type == REDIS_REPLY_STRING && !strcmp(r->str, "8"));
    freeReplyObject(r);

    char *argv3[] = {"region", "set-price", "us-east", "--input", "x", "--output", "8", NULL};
    assert_int_equal(gw_cmd_region(7, argv3), 2);
    char *argv4[] = {"region",   "set-price", "us-east", "--input",     "1",
                     "--output", "1",         "--redis", "127.0.0.1:1", NULL};
    assert_int_equal(gw_cmd_region(9, argv4), 1);
}

static void test_bad_settings(void **state)
{
    route_sync_opts o;
    char err[200];
    test_opts(&o);

    /* A wrong password: never ready, and says why. */
    o.password = "wrong";
    gw_start(&ga, &o, "eu-west", "eu", 1, 1);
    WAIT_UNTIL(strstr(route_sync_last_error(ga.sync), "WRONGPASS") ||
               strstr(route_sync_last_error(ga.sync), "invalid"));
    run_for(300);
    assert_false(route_sync_connected(ga.sync));
    assert_non_null(region(&ga, "eu-west")); /* the local region is in the table all the same */
    gw_stop(&ga);

    /* Nothing listening: refused, retried, never fatal. */
    test_opts(&o);
    o.port = free_port();
    gw_start(&ga, &o, "eu-west", "eu", 1, 1);
    run_for(300);
    assert_false(route_sync_connected(ga.sync));
    assert_non_null(strstr(route_sync_last_error(ga.sync), "cannot reach Redis"));
    assert_int_equal(route_sync_limit(ga.sync, "k", 5, 5, 1, on_limit, NULL), -ENOTCONN);
    gw_stop(&ga);

    /* A host name would block the loop in getaddrinfo: refused. */
    test_opts(&o);
    o.host = "redis.example";
    assert_int_equal(route_sync_opts_check(&o, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "numeric"));
    gw_start(&ga, &o, "eu-west", "eu", 1, 1);
    assert_non_null(strstr(route_sync_last_error(ga.sync), "numeric"));
    run_for(50);
    assert_false(route_sync_connected(ga.sync));
    test_opts(&o);
    o.host = "localhost";
    assert_int_equal(route_sync_opts_check(&o, err, sizeof(err)), 0);
    o.cluster = "a:b";
    assert_int_equal(route_sync_opts_check(&o, err, sizeof(err)), -EINVAL);
}

int main(void)
{
    static const char *const candidates[] = {"/usr/bin/redis-server", "/usr/local/bin/redis-server"};
    for (size_t i = 0; i < sizeof(candidates) / sizeof(candidates[0]); i++)
        if (access(candidates[i], X_OK) == 0)
            redis_path = candidates[i];
    if (!redis_path) {
        printf("# redis-server not found: skipped\n");
        return 77;
    }
    signal(SIGPIPE, SIG_IGN);
    redis_port = free_port();
    if (redis_port <= 0)
        return 1;
    snprintf(port_s, sizeof(port_s), "%d", redis_port);
    atexit(redis_kill);
    if (redis_start()) {
        fprintf(stderr, "cannot start redis-server on port %d\n", redis_port);
        return 1;
    }
    base = event_base_new();
    keepalive = event_new(base, -1, EV_PERSIST, on_keepalive, NULL);
    struct timeval tv = {1, 0};
    evtimer_add(keepalive, &tv);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_two_gateways, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_price, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fleet_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_read_and_ttl, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gcra, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gcra_debt_and_refund, setup, teardown),
        cmocka_unit_test_setup_teardown(test_redis_stopped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_script_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_redis_refuses_writes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reconnect_backoff, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shared_region_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shared_name_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shared_name_old_writer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_settings, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cli, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    event_free(keepalive);
    event_base_free(base);
    redis_kill();
    return rc;
}
