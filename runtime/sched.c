/* Continuous-batching scheduler (see sched.h): a compute thread that
 * admits requests, builds one batch per step (decodes first, then prefill
 * chunks within the token budget), runs the model, samples, and reports
 * text through callbacks. */
#include "runtime/sched.h"
#include "gateway/base/clock.h"

#include "runtime/engine_opts.h"
#include "runtime/grammar/grammar.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/sched_est.h"
#include "runtime/tokenizer.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_STOPS 16
#define EWMA_ALPHA 0.1
#define IDLE_WAIT_MS 200
#define EST_EVERY_S 0.05   /* the TTFT estimate is refreshed at most this often */
#define EST_MAX_WORK 200000 /* sequence-steps of replay per estimate, at most */

/* A tenant with requests here (or a debt: see sweep_tenants). Compute
 * thread only, but for the one a submitted request brings, which is its
 * own until intake links it or finds the tenant's. */
typedef struct tenant tenant;
struct tenant {
    tenant *next;
    char name[RT_SCHED_TENANT_MAX + 1];
    double weight;
    double vt;     /* tokens computed for it / weight: the least goes next */
    int n_present; /* its requests waiting or running */
    int est_idx;   /* its index in est_tn, as est_fill last made it */
    /* Catch-up (sched.h): the tokens computed for it lately, decayed a
     * step at a time (RT_SCHED_RECENT_DECAY), and this step's so far; what
     * it may still take past the step's budget (owe_tenants), and whether
     * it was owed any as the step began (its prompts go first). */
    double recent;
    uint64_t used;
    int allow;
    bool owed;
    /* what rt_sched_tenants has not counted yet (publish_tenants) */
    uint64_t tokens_new, preempted_new;
};

/* A tenant's reported figures (rt_sched_tenants), kept past its requests;
 * under mu. */
typedef struct tfig {
    rt_sched_tenant_stats st;
    double active; /* when it last had requests here (gw_mono_s) */
} tfig;

typedef struct sreq sreq;

/* A tenant's requests waiting that were never admitted, per priority: the
 * queue's fair bound (sched.h). Under mu; the compute thread's `tenant` is
 * another table. Kept while it has such requests. */
typedef struct qtenant qtenant;
struct qtenant {
    qtenant *next;
    char name[RT_SCHED_TENANT_MAX + 1];
    double weight; /* the last request's */
    int n_fresh[2];
    sreq *oldest[2], *youngest[2]; /* those requests, in submission order (sreq.fprev, fnext) */
};

/* Where a request stands with the queue's bound. FRESH until the compute
 * thread admits or drops it (TAKEN) or a submit pushes it out (EVICTED);
 * whichever comes first wins the compare-and-swap. */
enum { Q_FRESH, Q_TAKEN, Q_EVICTED };

struct sreq {
    sreq *next; /* in inbox or a waiting queue */
    /* The queue's bound, under mu: its tenant's entry and place in it while FRESH. */
    _Atomic int qstate;
    qtenant *qt;
    sreq *fprev, *fnext;
    uint64_t id;
    rt_sched_cb cb;
    void *user;
    int32_t *tokens; /* prompt, then every generated token */
    int n_tokens, n_prompt, max_new, n_gen;
    int n_done; /* positions already in the KV cache */
    int n_cached; /* of the prompt, the positions the prefix cache gave (the admission that prefilled it) */
    /* The sampler (16 bytes a vocabulary entry) and the log-probability
     * row are made at admission: a queue of waiting requests holding them
     * took 2 MiB each with a 128k vocabulary. */
    rt_sampler_params sampling;
    bool logprobs;
    rt_sampler *smp;
    rt_stop *stop;
    int top_logprobs;     /* with lp_row: how many of the likeliest to report */
    float *lp_row;        /* log-probabilities asked for: the step's raw logits, kept from the sampler */
    float *first_logits;  /* the caller's, until the first token's logits are in it */
    rt_token_logprobs lp; /* the last token's */
    /* with lp_row: generated tokens whose text has begun to go out, the
     * byte where the next one's begins, and the bytes gone out */
    int lp_ready;
    size_t lp_ready_at, text_out;
    bool ignore_eos, cancelled;
    bool held; /* rt_sched_hold: left out of batches, its KV kept, until released */
    /* Constrained sampling: the grammar (a reference), its matcher and the
     * mask it fills (made at admission, as the sampler), kept across a
     * preemption: what was generated stays generated. */
    rt_grammar *grammar;
    rt_gmatch *gm;
    uint32_t *gmask;
    int gmask_rc;     /* with gmask_ready: rt_gmatch_mask's, for this step */
    bool gmask_ready; /* the mask thread filled gmask while the forward pass ran */
    /* Time spent waiting is what ages a batch request (aged): t_queued is
     * when it last joined a waiting queue, waited_s its time in them
     * before that. Running time does not count: a batch job preempted
     * after running for batch_max_wait_ms came straight back ahead of the
     * interactive request it gave way to, and then could not be preempted.
     * Admitted having waited that long, it is not made to give way again
     * (it could wait for ever), preemptions or not (gives_way_first). */
    double t_queued, waited_s;
    rt_priority prio;
    int64_t deadline_ms;
    rt_seq *seq;
    double t_submit, t_admit, t_last;
    tenant *tn;  /* linked at intake; before, the request's own (tn_own) */
    bool tn_own;
    /* INFERGATE_EST_TRACE: the estimate published when it was submitted,
     * the replay's for it when the compute thread took it in, and the
     * steps' real and fitted time then (see trace_first) */
    double tr_pub, tr_fresh, tr_real0, tr_pred0, t_intake;
    int n_charged; /* positions its tenant was charged for: a recompute is not charged again */
};

typedef struct queue {
    sreq *head, *tail;
    int n;
} queue;

struct rt_sched {
    rt_model *model;
    const rt_tokenizer *tok;
    rt_kv *kv;
    rt_sched_opts o;
    int n_ctx, n_vocab;

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stopping;
    uint64_t next_id;
    queue inbox;       /* submitted, not yet seen by the compute thread */
    uint64_t *cancels; /* ids asked to stop */
    int n_cancels, cap_cancels;
    uint64_t *holds; /* ids to hold, or to release (| HOLD_RELEASE), in the order asked */
    int n_holds, cap_holds;
    int n_waiting[2]; /* inbox + waiting queue of each priority, for -EAGAIN */
    qtenant *qtenants; /* the queue's fair bound */
    tfig figs[RT_SCHED_TENANT_FIGS];
    int n_figs;
    tfig other;      /* the figures of tenants that found none free (RT_SCHED_TENANT_OTHER) */
    bool other_used; /* reported from then on */
    rt_sched_stats stats;

    /* compute thread only */
    queue waiting[2];
    sreq **running; /* admission order */
    int n_running;
    rt_batch_entry *batch;
    int *take;
    int *order; /* running indices, the prefill passes' order (fair_order) */
    tenant *tenants; /* those with requests here, and those in debt */
    float *logits;
    int32_t *sampled; /* the token drawn from each batch entry's logits */
    bool overlap_masks; /* masks on a thread of their own during the forward pass */
    sreq **masking;     /* this step's requests whose masks that thread computes */
    int n_masking;
    double rate_t0;
    uint64_t rate_tokens0;
    /* the TTFT estimate (sched_est.h) */
    rt_step_fit fit;
    double fit_t0;   /* when the step being timed began; 0: none */
    double idle_t;   /* when the fit was last relaxed for idleness (rt_step_fit_relax); 0: busy */
    int fit_tokens;  /* its tokens */
    double est_t;           /* when it was last computed */
    double prompt_ewma;     /* prompt tokens the requests admitted lately computed (not the prefix cache's) */
    double gen_frac;        /* of max_new, what finished requests generated (stop before length) */
    rt_est_seq *est_run, *est_q;
    int *est_run_tn, *est_q_tn; /* their tenants: indices in est_tn */
    int est_q_cap;
    rt_est_tenant *est_tn; /* the replay's tenants (sched_est.h) */
    const char **est_tn_name;
    int est_tn_cap;
    bool trace;                    /* INFERGATE_EST_TRACE set: one line per request's first token */
    double tr_real_ms, tr_pred_ms; /* every step's time, and the fit's for it before it was added */
};

static void trace_intake(rt_sched *s);
static void trace_first(const rt_sched *s, const sreq *r, double now);

/* Mirrors the waiting counts into the stats; call with mu held. */
static void count_queued(rt_sched *s)
{
    s->stats.queued = s->n_waiting[0] + s->n_waiting[1];
    s->stats.queued_batch = s->n_waiting[1];
}

/* Under mu. Each priority has its own max_queue, so that a backlog of batch
 * jobs never turns an interactive request away. Requests that will start
 * at once are not counted as queued: the free sequence slots go to the
 * waiting interactive requests first, as admission gives them. */
static int room(const rt_sched *s, int prio)
{
    int free = s->o.max_seqs - s->stats.running;
    if (free < 0)
        free = 0;
    int starts = prio == RT_PRIO_INTERACTIVE ? free : free - s->n_waiting[RT_PRIO_INTERACTIVE];
    int n = s->o.max_queue + (starts > 0 ? starts : 0) - s->n_waiting[prio];
    return n > 0 ? n : 0;
}

/* ---- the queue's fair bound (see sched.h; under mu) ---- */

static qtenant *qt_find(const rt_sched *s, const char *name)
{
    qtenant *t = s->qtenants;
    while (t && strcmp(t->name, name))
        t = t->next;
    return t;
}

/* Under mu: tenant name's figures, made (or recycled from the one idle
 * longest: nothing running or queued, and not active at `now`) when it
 * has none; s->other when every one is busy. */
static tfig *fig_of(rt_sched *s, const char *name, double now)
{
    tfig *idle = NULL;
    for (int i = 0; i < s->n_figs; i++) {
        tfig *f = &s->figs[i];
        if (!strcmp(f->st.name, name))
            return f;
        if (!f->st.running && !f->st.queued && f->active < now && (!idle || f->active < idle->active))
            idle = f;
    }
    tfig *f = s->n_figs < RT_SCHED_TENANT_FIGS ? &s->figs[s->n_figs++] : idle;
    if (!f) {
        snprintf(s->other.st.name, sizeof(s->other.st.name), "%s", RT_SCHED_TENANT_OTHER);
        s->other_used = true;
        return &s->other;
    }
    memset(f, 0, sizeof(*f));
    snprintf(f->st.name, sizeof(f->st.name), "%s", name);
    f->active = now;
    return f;
}

/* With prio's queue full: the tenant that gives a place to a request of
 * tenant `name` (weight w), the one whose never-admitted requests of prio
 * are the most per weight, when it has more than that tenant would have
 * with the request (so places never swing back and forth); else NULL. */
static qtenant *qt_fattest(const rt_sched *s, const char *name, double w, int prio)
{
    const qtenant *own = qt_find(s, name);
    double have = (own ? own->n_fresh[prio] : 0) + 1;
    qtenant *most = NULL;
    for (qtenant *t = s->qtenants; t; t = t->next)
        if (t != own && t->n_fresh[prio] > 0 &&
            (!most || t->n_fresh[prio] / t->weight > most->n_fresh[prio] / most->weight))
            most = t;
    return most && most->n_fresh[prio] / most->weight > have / w ? most : NULL;
}

static void qt_link(qtenant *t, sreq *r, int prio)
{
    r->qt = t;
    r->fnext = NULL;
    r->fprev = t->youngest[prio];
    if (r->fprev)
        r->fprev->fnext = r;
    else
        t->oldest[prio] = r;
    t->youngest[prio] = r;
    t->n_fresh[prio]++;
}

/* r leaves its tenant's never-admitted requests; the entry goes with its last. */
static void qt_unlink(rt_sched *s, sreq *r)
{
    qtenant *t = r->qt;
    if (!t)
        return;
    int prio = r->prio;
    if (r->fprev)
        r->fprev->fnext = r->fnext;
    else
        t->oldest[prio] = r->fnext;
    if (r->fnext)
        r->fnext->fprev = r->fprev;
    else
        t->youngest[prio] = r->fprev;
    r->qt = NULL;
    if (--t->n_fresh[prio] + t->n_fresh[1 - prio] > 0)
        return;
    for (qtenant **pp = &s->qtenants; *pp; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            free(t);
            return;
        }
}

/* The youngest never-admitted request of tenant t and prio gives its place:
 * it is answered -EAGAIN by the compute thread when next seen. True when
 * one did (the compute thread may have taken them all meanwhile). */
static bool push_out(rt_sched *s, qtenant *t, int prio)
{
    for (sreq *v = t->youngest[prio]; v; v = v->fprev) {
        int st = Q_FRESH;
        if (atomic_compare_exchange_strong(&v->qstate, &st, Q_EVICTED)) {
            fig_of(s, t->name, gw_mono_s())->st.pushed_out++;
            qt_unlink(s, v);
            s->n_waiting[prio]--;
            s->stats.pushed_out++;
            return true;
        }
    }
    return false;
}

/* The compute thread takes waiting request r out of the bound, admitted
 * or dropped. False when a submit pushed it out first: it is then answered
 * -EAGAIN, its counts already taken off. */
static bool take_fresh(rt_sched *s, sreq *r)
{
    int st = Q_FRESH;
    if (atomic_compare_exchange_strong(&r->qstate, &st, Q_TAKEN)) {
        pthread_mutex_lock(&s->mu);
        qt_unlink(s, r);
        pthread_mutex_unlock(&s->mu);
        return true;
    }
    return st != Q_EVICTED;
}

int rt_sched_room(rt_sched *s, rt_priority p)
{
    pthread_mutex_lock(&s->mu);
    int n = room(s, p == RT_PRIO_BATCH ? RT_PRIO_BATCH : RT_PRIO_INTERACTIVE);
    pthread_mutex_unlock(&s->mu);
    return n;
}

bool rt_sched_may_push_out(rt_sched *s, rt_priority p, const char *tname, double weight)
{
    const char *name = tname ? tname : "";
    if (strlen(name) > RT_SCHED_TENANT_MAX)
        return false;
    pthread_mutex_lock(&s->mu);
    bool may = !s->stopping && qt_fattest(s, name, weight > 0 ? weight : 1,
                                          p == RT_PRIO_BATCH ? RT_PRIO_BATCH : RT_PRIO_INTERACTIVE);
    pthread_mutex_unlock(&s->mu);
    return may;
}

/* The defaults of the options an operator sets are the table's. */
void rt_sched_opts_default(rt_sched_opts *o)
{
    const rt_eopt_def *d = rt_eopt_defs;
    *o = (rt_sched_opts){
        .kv_bytes = (size_t)d[RT_EOPT_KV_CACHE_MB].dflt << 20,
        .block_tokens = 16,
        .kv_type = rt_eopt_kv_type(d[RT_EOPT_KV_TYPE].dflt),
        .max_seqs = (int)d[RT_EOPT_MAX_SEQS].dflt,
        .max_batch_tokens = (int)d[RT_EOPT_MAX_BATCH_TOKENS].dflt,
        .max_queue = (int)d[RT_EOPT_MAX_QUEUE].dflt,
        .batch_max_wait_ms = (int)d[RT_EOPT_BATCH_MAX_WAIT_MS].dflt,
        .prompt_max_wait_ms = (int)d[RT_EOPT_PROMPT_MAX_WAIT_MS].dflt,
        .prefix_cache = d[RT_EOPT_PREFIX_CACHE].dflt != 0,
        .overlap_masks = -1,
    };
}

static void q_push(queue *q, sreq *r)
{
    r->next = NULL;
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    q->n++;
}

static void q_push_front(queue *q, sreq *r)
{
    r->next = q->head;
    q->head = r;
    if (!q->tail)
        q->tail = r;
    q->n++;
}

static sreq *q_pop(queue *q)
{
    sreq *r = q->head;
    if (r) {
        q->head = r->next;
        if (!q->head)
            q->tail = NULL;
        q->n--;
    }
    return r;
}

static void sreq_free(sreq *r)
{
    if (r->tn_own)
        free(r->tn);
    else if (r->tn)
        r->tn->n_present--;
    rt_seq_free(r->seq);
    rt_gmatch_free(r->gm);
    free(r->gmask);
    rt_grammar_free(r->grammar);
    rt_sampler_free(r->smp);
    rt_stop_free(r->stop);
    free(r->lp_row);
    free(r->tokens);
    free(r);
}

static int blocks_for(const rt_sched *s, int n_tokens)
{
    return rt_kv_blocks_for(s->kv, n_tokens);
}

/* ---- submission (any thread) ---- */

static int lp_ready(const rt_sched *s, sreq *r, size_t out, bool done, bool matched);
static size_t mask_bytes(const rt_sched *s);

/* A resumed request's tokens, as if generated here (a recompute after a
 * preemption, which admission makes of it): their text goes through the
 * stop strings, and what those let out is dropped, the client having had
 * it; a tail they hold back is held as an unbroken run held it. The
 * grammar's matcher moves past them as it did while they were generated,
 * and the log-probabilities' count of tokens sent is where it was. The
 * sampler is brought to the same point at admission (new_sampler). 0;
 * -EINVAL where that run had ended (a stop string, the grammar complete),
 * -EILSEQ for a token the grammar refuses, -ENOTSUP for log-probabilities
 * of tokens whose text was held back (they went with the failed run);
 * -ENOMEM. */
static int resume_text(const rt_sched *s, sreq *q, const rt_sched_req *r)
{
    const int32_t *toks = r->resume;
    const int n = r->n_resume;
    if (q->grammar && (!(q->gm = rt_gmatch_new(q->grammar)) || !(q->gmask = malloc(mask_bytes(s)))))
        return -ENOMEM;
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        const char *piece = rt_tokenizer_piece(s->tok, toks[i], &len);
        if (piece && len > 0 && rt_stop_feed(q->stop, piece, len))
            /* a stop string in text already sent: that stream had ended */
            return rt_stop_error(q->stop) ? -ENOMEM : -EINVAL;
        const char *text = rt_stop_take(q->stop, false, &len);
        int trc = r->resumed_text ? r->resumed_text(r->resumed_ud, text ? text : "", text ? len : 0) : 0;
        if (trc)
            return trc;
        int grc = q->gm ? rt_gmatch_accept(q->gm, toks[i]) : 0;
        if (grc)
            return grc == -EINVAL ? -EILSEQ : grc;
        if (q->gm && rt_gmatch_must_end(q->gm))
            return -EINVAL;
        q->tokens[q->n_tokens++] = toks[i];
        q->n_gen = i + 1;
        (void)lp_ready(s, q, len, false, false);
    }
    return q->logprobs && q->lp_ready < n ? -ENOTSUP : 0;
}

int rt_sched_submit(rt_sched *s, const rt_sched_req *r, uint64_t *id)
{
    if (r->n_prompt <= 0 || r->n_stops < 0 || r->n_stops > MAX_STOPS || !r->cb)
        return -EINVAL;
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= s->n_vocab)
            return -EINVAL;
    if (r->n_prompt >= s->n_ctx)
        return -E2BIG;
    /* One sequence may grow to the context length or the whole pool,
     * whichever is less. Without max_tokens it gets that much room: a pool
     * smaller than one full context (Llama-3-8B's 8k in the default 256 MiB
     * holds 2k) must not turn every request that names no limit away. */
    const int64_t pool_tokens = rt_kv_seq_tokens_max(s->kv);
    if (r->n_prompt >= pool_tokens)
        return -ENOSPC;
    int max_new = s->n_ctx - r->n_prompt;
    if (r->max_tokens > 0) {
        if (r->max_tokens > max_new)
            return -E2BIG;
        max_new = r->max_tokens;
        if (r->n_prompt + max_new > pool_tokens)
            return -ENOSPC;
    } else if (max_new > pool_tokens - r->n_prompt) {
        max_new = (int)(pool_tokens - r->n_prompt);
    }

    if (!rt_sampler_params_ok(&r->sampling, s->n_vocab) || r->n_resume < 0 || r->n_resume >= max_new)
        return -EINVAL;
    for (int i = 0; i < r->n_resume; i++)
        if (r->resume[i] < 0 || r->resume[i] >= s->n_vocab)
            return -EINVAL;
    const char *tname = r->tenant ? r->tenant : "";
    if (strlen(tname) > RT_SCHED_TENANT_MAX ||
        !(r->weight == 0 || (r->weight >= RT_SCHED_WEIGHT_MIN && r->weight <= RT_SCHED_WEIGHT_MAX)))
        return -EINVAL;
    sreq *q = calloc(1, sizeof(*q));
    if (!q)
        return -ENOMEM;
    if (!(q->tn = calloc(1, sizeof(*q->tn)))) {
        free(q);
        return -ENOMEM;
    }
    q->tn_own = true;
    strcpy(q->tn->name, tname);
    q->tn->weight = r->weight > 0 ? r->weight : 1;
    q->tokens = malloc((size_t)(r->n_prompt + max_new) * sizeof(int32_t));
    q->stop = rt_stop_new(r->stops, r->n_stops);
    q->sampling = r->sampling;
    q->logprobs = r->logprobs;
    q->top_logprobs = r->top_logprobs; /* rt_logprobs clamps it */
    q->first_logits = r->first_logits;
    q->grammar = r->grammar ? rt_grammar_ref(r->grammar) : NULL;
    if (!q->tokens || !q->stop) {
        sreq_free(q);
        return -ENOMEM;
    }
    memcpy(q->tokens, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
    q->n_tokens = q->n_prompt = r->n_prompt;
    int rrc = r->n_resume ? resume_text(s, q, r) : 0;
    if (rrc) {
        sreq_free(q);
        return rrc;
    }
    q->max_new = max_new;
    q->ignore_eos = r->ignore_eos;
    q->prio = r->priority == RT_PRIO_BATCH ? RT_PRIO_BATCH : RT_PRIO_INTERACTIVE;
    q->deadline_ms = r->deadline_ms;
    q->cb = r->cb;
    q->user = r->user;
    q->t_submit = q->t_queued = gw_mono_s();
    atomic_init(&q->qstate, Q_FRESH);
    qtenant *spare = calloc(1, sizeof(*spare)); /* its tenant's entry, if it has none yet */

    pthread_mutex_lock(&s->mu);
    int rc = 0;
    qtenant *fat, *qt = qt_find(s, tname);
    if (s->stopping)
        rc = -ESHUTDOWN;
    else if (!qt && !spare)
        rc = -ENOMEM;
    else if (room(s, q->prio) == 0 &&
             (!(fat = qt_fattest(s, tname, q->tn->weight, q->prio)) || !push_out(s, fat, q->prio)))
        rc = -EAGAIN;
    if (rc) {
        pthread_mutex_unlock(&s->mu);
        free(spare);
        sreq_free(q);
        return rc;
    }
    if (!qt) {
        qt = spare;
        spare = NULL;
        strcpy(qt->name, tname);
        qt->next = s->qtenants;
        s->qtenants = qt;
    }
    qt->weight = q->tn->weight;
    qt_link(qt, q, q->prio);
    q->id = ++s->next_id;
    *id = q->id;
    q->tr_pub = s->stats.est_ttft_ms;
    q_push(&s->inbox, q);
    s->n_waiting[q->prio]++;
    count_queued(s);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    free(spare);
    return 0;
}

/* Appends id to a list the compute thread takes whole; under mu. False
 * when there is no memory for it. */
static bool list_push(uint64_t **ids, int *n, int *cap, uint64_t id)
{
    if (*n == *cap) {
        int c = *cap ? *cap * 2 : 16;
        uint64_t *p = realloc(*ids, (size_t)c * sizeof(uint64_t));
        if (!p)
            return false;
        *ids = p;
        *cap = c;
    }
    (*ids)[(*n)++] = id;
    return true;
}

void rt_sched_cancel(rt_sched *s, uint64_t id)
{
    pthread_mutex_lock(&s->mu);
    /* Without memory the request runs to its end instead; its client is
     * gone and the gateway drops the output. */
    if (list_push(&s->cancels, &s->n_cancels, &s->cap_cancels, id))
        pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

#define HOLD_RELEASE ((uint64_t)1 << 63)

int rt_sched_hold(rt_sched *s, uint64_t id, bool hold)
{
    pthread_mutex_lock(&s->mu);
    bool ok = list_push(&s->holds, &s->n_holds, &s->cap_holds, hold ? id : id | HOLD_RELEASE);
    if (ok)
        pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return ok ? 0 : -ENOMEM;
}

void rt_sched_get_stats(rt_sched *s, rt_sched_stats *st)
{
    pthread_mutex_lock(&s->mu);
    *st = s->stats;
    pthread_mutex_unlock(&s->mu);
}

/* ---- compute thread ---- */

static void emit(sreq *r, rt_sched_event *ev)
{
    ev->id = r->id;
    ev->prompt_tokens = r->n_prompt;
    ev->completion_tokens = r->n_gen;
    ev->cached_tokens = r->n_cached;
    r->cb(r->user, ev);
}

static void finish_error(rt_sched *s, sreq *r, int error)
{
    rt_sched_event ev = {.kind = RT_EV_ERROR, .error = error};
    emit(r, &ev);
    sreq_free(r);
}

/* Drops the finished (NULL) slots of the running list, keeping order. */
static void compact_running(rt_sched *s)
{
    int j = 0;
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i])
            s->running[j++] = s->running[i];
    s->n_running = j;
}

static bool take_cancel(uint64_t *ids, int n, uint64_t id)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == id) {
            ids[i] = 0;
            return true;
        }
    return false;
}

/* Nothing sent yet (a request preempted in its prefill, or still
 * prefilling, included) and its deadline passed. */
static bool past_deadline(const sreq *r, int64_t now)
{
    return r->n_gen == 0 && r->deadline_ms && now > r->deadline_ms;
}

/* Applies holds and releases, in the order they were asked, to the
 * requests still here (running or waiting); unknown ids are ignored. */
static void apply_holds(rt_sched *s, const uint64_t *ops, int n)
{
    for (int i = 0; i < n; i++) {
        uint64_t id = ops[i] & ~HOLD_RELEASE;
        bool hold = !(ops[i] & HOLD_RELEASE);
        for (int k = 0; k < s->n_running; k++)
            if (s->running[k]->id == id)
                s->running[k]->held = hold;
        for (int p = 0; p < 2; p++)
            for (sreq *r = s->waiting[p].head; r; r = r->next)
                if (r->id == id)
                    r->held = hold;
    }
}

/* ---- fair share between tenants (see sched.h) ---- */

/* The least virtual time of the tenants with requests here but `but`;
 * -1 when there is none. */
static double least_vt(const rt_sched *s, const tenant *but)
{
    double v = -1;
    for (const tenant *t = s->tenants; t; t = t->next)
        if (t != but && t->n_present > 0 && (v < 0 || t->vt < v))
            v = t->vt;
    return v;
}

/* Forgets the tenants with no request here whose return would start them
 * level with the least present anyway (no debt) and who had no work done
 * lately (else a tenant leaving and coming back would be owed afresh:
 * catch-up), and all of them when none is present: the table holds the
 * present, the indebted and the recently served. */
static void sweep_tenants(rt_sched *s)
{
    double least = least_vt(s, NULL);
    for (tenant **pp = &s->tenants; *pp;) {
        tenant *t = *pp;
        if (t->n_present == 0 && (least < 0 || (t->vt <= least && t->recent < 1))) {
            *pp = t->next;
            free(t);
        } else {
            pp = &t->next;
        }
    }
}

/* Gives r, new, the table's entry for its tenant (its own becomes it when
 * there is none), with the weight r brought. A tenant coming back starts
 * level with the least present: no credit for its idle time. */
static void link_tenant(rt_sched *s, sreq *r)
{
    tenant *own = r->tn, *t = s->tenants;
    while (t && strcmp(t->name, own->name))
        t = t->next;
    if (t) {
        t->weight = own->weight;
        free(own);
    } else {
        t = own;
        t->next = s->tenants;
        s->tenants = t;
    }
    r->tn = t;
    r->tn_own = false;
    if (t->n_present++ == 0) {
        double least = least_vt(s, t);
        if (least > t->vt)
            t->vt = least;
    }
}

/* Charges r's tenant for the positions [from, to) a step computed, less
 * those it computed before a preemption. */
static void charge(sreq *r, int from, int to)
{
    if (from < r->n_charged)
        from = r->n_charged;
    if (to > from) {
        r->tn->vt += (to - from) / r->tn->weight;
        r->tn->tokens_new += (uint64_t)(to - from);
        r->tn->used += (uint64_t)(to - from);
        r->n_charged = to;
    }
}

/* The request to admit next from q: the first of the tenant with the least
 * virtual time, of the one with the least recent work per weight among
 * those level (a tenant coming back starts level with the least: without
 * it, it waited a step behind the other's queue); *prev is the one before
 * it (NULL: the head). */
static sreq *fair_pick(queue *q, sreq **prev)
{
    sreq *best = q->head, *p = NULL;
    *prev = NULL;
    for (sreq *r = q->head; r; p = r, r = r->next)
        if (rt_sched_fair_before(r->tn->vt, r->tn->recent / r->tn->weight, best->tn->vt,
                                 best->tn->recent / best->tn->weight)) {
            best = r;
            *prev = p;
        }
    return best;
}

static void q_remove(queue *q, sreq *prev, sreq *r)
{
    if (!prev) {
        q_pop(q);
        return;
    }
    prev->next = r->next;
    if (q->tail == r)
        q->tail = prev;
    q->n--;
}

/* Slots tenant t holds, plus `extra`, per weight. */
static double slots_per_weight(const rt_sched *s, const tenant *t, int extra)
{
    int n = extra;
    for (int i = 0; i < s->n_running; i++)
        n += s->running[i]->tn == t;
    return n / t->weight;
}

/* Catch-up (sched.h): sets what each tenant present is owed this step
 * (rt_sched_owed), with n_dec sequences decoding. Returns the prompt tokens
 * the step may carry past its budget for them (rt_sched_catchup_budget; 0
 * with one tenant present, or none owed). */
static int owe_tenants(rt_sched *s, int n_dec)
{
    double sum_recent = 0, sum_w = 0;
    int present = 0;
    for (const tenant *t = s->tenants; t; t = t->next)
        if (t->n_present > 0) {
            sum_recent += t->recent;
            sum_w += t->weight;
            present++;
        }
    int pool = present > 1 ? rt_sched_catchup_budget(s->o.max_batch_tokens, n_dec) : 0;
    for (tenant *t = s->tenants; t; t = t->next) {
        t->allow = pool > 0 && t->n_present > 0 ? rt_sched_owed(t->recent, t->weight, sum_recent, sum_w) : 0;
        t->owed = t->allow > 0;
    }
    return pool;
}

/* The catch-up tokens a prompt of tenant t with `more` tokens still to go
 * past its share of the budget takes from *pool: what t is still owed. */
static int catch_up(tenant *t, int more, int *pool)
{
    int take = more < *pool ? more : *pool;
    take = take < t->allow ? take : t->allow;
    if (take <= 0)
        return 0;
    *pool -= take;
    t->allow -= take;
    return take;
}

/* A step's work done: each tenant's recent work decays and takes in what
 * the step computed for it. */
static void age_recent(rt_sched *s)
{
    for (tenant *t = s->tenants; t; t = t->next) {
        t->recent = t->recent * RT_SCHED_RECENT_DECAY + (double)t->used;
        t->used = 0;
    }
}

/* Whether r's prompt has waited prompt_max_wait_ms for its first token. */
static bool prompt_aged(const rt_sched *s, const sreq *r, double now)
{
    return now - r->t_submit >= s->o.prompt_max_wait_ms / 1e3;
}

/* Whether running request a's prompt goes before b's (admitted before a)
 * in a step's budget: the tenant with the least virtual time first; then
 * an aged prompt (prompt_max_wait_ms); then, of two not aged, the one with
 * fewer tokens left. In admission order alone, the turns of a chat whose
 * prefix was cached (a few dozen tokens to compute) waited behind the long
 * first prompts of the conversations admitted before them. The key is
 * the same between tenants of equal virtual times (neither owes the other),
 * and the estimate's replay follows it (sched_est.c, in_line_before). */
static bool goes_before(const rt_sched *s, const sreq *a, const sreq *b, double now)
{
    if (a->tn->vt != b->tn->vt)
        return a->tn->vt < b->tn->vt;
    bool aged_a = prompt_aged(s, a, now);
    if (aged_a != prompt_aged(s, b, now))
        return aged_a;
    return !aged_a && a->n_tokens - a->n_done < b->n_tokens - b->n_done;
}

/* s->order: the running requests' indices in the order the prompt passes
 * take them (goes_before; admission order between equals). */
static void fair_order(rt_sched *s, double now)
{
    for (int i = 0; i < s->n_running; i++) {
        const sreq *r = s->running[i];
        int j = i;
        for (; j > 0 && goes_before(s, r, s->running[s->order[j - 1]], now); j--)
            s->order[j] = s->order[j - 1];
        s->order[j] = i;
    }
}

/* Moves new requests in, applies cancellations, drops the requests whose
 * deadline passed before their first token, waiting or prefilling: a long
 * prompt's prefill runs for many steps. */
static void intake(rt_sched *s)
{
    sweep_tenants(s);
    pthread_mutex_lock(&s->mu);
    sreq *r;
    while ((r = q_pop(&s->inbox))) {
        link_tenant(s, r);
        q_push(&s->waiting[r->prio], r);
    }
    /* The list is taken whole (rt_sched_cancel starts another): a copy
     * that could not be made left the cancellations pending, and the
     * loop spinning on them until memory came back. */
    int n_cancels = s->n_cancels;
    uint64_t *ids = s->cancels;
    s->cancels = NULL;
    s->n_cancels = s->cap_cancels = 0;
    int n_holds = s->n_holds;
    uint64_t *holds = s->holds;
    s->holds = NULL;
    s->n_holds = s->cap_holds = 0;
    pthread_mutex_unlock(&s->mu);
    apply_holds(s, holds, n_holds);
    free(holds);

    int64_t now = gw_epoch_ms();
    int cancelled = 0;
    for (int i = 0; i < s->n_running; i++) {
        sreq *q = s->running[i];
        const int err = n_cancels && take_cancel(ids, n_cancels, q->id) ? -ECANCELED
                        : past_deadline(q, now)                         ? -ETIMEDOUT
                                                                        : 0;
        cancelled += err == -ECANCELED;
        if (err) {
            finish_error(s, q, err);
            s->running[i] = NULL;
        }
    }
    compact_running(s);
    int dropped[2] = {0, 0};
    for (int p = 0; p < 2; p++) {
        queue keep = {0};
        while ((r = q_pop(&s->waiting[p]))) {
            const int err = n_cancels && take_cancel(ids, n_cancels, r->id) ? -ECANCELED
                            : past_deadline(r, now)                         ? -ETIMEDOUT
                                                                            : 0;
            if (atomic_load(&r->qstate) == Q_EVICTED) {
                finish_error(s, r, -EAGAIN); /* its place went to another tenant's request */
            } else if (err) {
                bool mine = take_fresh(s, r);
                dropped[p] += mine;
                cancelled += err == -ECANCELED;
                finish_error(s, r, mine ? err : -EAGAIN);
            } else {
                q_push(&keep, r);
            }
        }
        s->waiting[p] = keep;
    }
    free(ids);
    if (dropped[0] || dropped[1] || cancelled) {
        pthread_mutex_lock(&s->mu);
        s->n_waiting[0] -= dropped[0];
        s->n_waiting[1] -= dropped[1];
        s->stats.requests_cancelled += (uint64_t)cancelled;
        count_queued(s);
        pthread_mutex_unlock(&s->mu);
    }
    if (s->trace)
        trace_intake(s);
}

static bool waited_long(const rt_sched *s, double waited_s)
{
    return waited_s >= s->o.batch_max_wait_ms / 1e3;
}

/* The queue to admit from: interactive, unless the oldest batch request
 * has waited batch_max_wait_ms in all and came before the oldest
 * interactive one. r is waiting. */
static bool aged(const rt_sched *s, const sreq *r, double now)
{
    return waited_long(s, r->waited_s + (now - r->t_queued));
}

static queue *next_queue(rt_sched *s, double now)
{
    queue *in = &s->waiting[0], *ba = &s->waiting[1];
    if (!ba->head)
        return in;
    if (!in->head)
        return ba;
    return aged(s, ba->head, now) && ba->head->t_submit < in->head->t_submit ? ba : in;
}

/* Running request v gives its blocks back and waits at the head of its
 * queue to be recomputed from its tokens. */
static void preempt_at(rt_sched *s, int v)
{
    sreq *r = s->running[v];
    /* the rest keep their admission order, which prefill follows */
    memmove(&s->running[v], &s->running[v + 1], (size_t)(s->n_running - v - 1) * sizeof(s->running[0]));
    s->n_running--;
    rt_seq_free(r->seq);
    r->seq = NULL;
    r->n_done = 0;
    r->t_queued = gw_mono_s();
    q_push_front(&s->waiting[r->prio], r);
    pthread_mutex_lock(&s->mu);
    s->n_waiting[r->prio]++;
    count_queued(s);
    s->stats.preemptions++;
    s->stats.running = s->n_running;
    pthread_mutex_unlock(&s->mu);
}

/* The running request to give way: the youngest batch request not
 * admitted after waiting batch_max_wait_ms; where there is none and
 * `batch_only` is false, the youngest of all; else -1. Youngest by
 * submission, not admission: a request readmitted after a preemption
 * keeps its seniority, or it would be the next to give way, again and
 * again, and never finish. */
static bool gives_way_first(const rt_sched *s, const sreq *r)
{
    return r->prio == RT_PRIO_BATCH && !waited_long(s, r->waited_s);
}

static int youngest(const rt_sched *s, bool batch_only)
{
    int v = -1;
    for (int i = 0; i < s->n_running; i++)
        if (gives_way_first(s, s->running[i]) &&
            (v < 0 || s->running[i]->t_submit >= s->running[v]->t_submit))
            v = i;
    if (v >= 0 || batch_only)
        return v;
    for (int i = 0; i < s->n_running; i++)
        if (v < 0 || s->running[i]->t_submit >= s->running[v]->t_submit)
            v = i;
    return v;
}

/* Whether preempting every running batch request that youngest may
 * pick would make room for a request of `blocks`: if not, none is
 * preempted, as their work would be lost and the request wait all the same. */
static bool preemption_makes_room(const rt_sched *s, int blocks, int promised)
{
    int n = s->n_running, free_blocks = rt_kv_blocks_free(s->kv);
    for (int i = 0; i < s->n_running; i++) {
        const sreq *r = s->running[i];
        if (!gives_way_first(s, r))
            continue;
        n--;
        free_blocks += rt_seq_blocks_freeable(r->seq);
        promised -= rt_seq_blocks_needed(r->seq, r->n_tokens - r->n_done);
    }
    return n < s->o.max_seqs && (n == 0 || blocks + promised + n <= free_blocks);
}

/* Whether running request c may give way to waiting r for fair share:
 * another tenant's, of r's priority or lower (a batch one not admitted
 * after a long wait). */
static bool may_give_way(const rt_sched *s, const sreq *c, const sreq *r)
{
    return c->tn != r->tn && c->prio >= r->prio && (c->prio == RT_PRIO_INTERACTIVE || gives_way_first(s, c));
}

/* For waiting request r, when the slots or the KV room are short: the
 * running request to give way to it for fair share, or -1. It is the
 * youngest of those that may (may_give_way) of the tenant holding the most
 * slots per weight, provided r's tenant, given the slot, holds no more per
 * weight than that one keeps (so slots never swing back and forth), and
 * its blocks make room for r's. */
static int fair_victim(const rt_sched *s, const sreq *r, int blocks, int promised)
{
    const tenant *most = NULL;
    double most_spw = 0;
    for (int i = 0; i < s->n_running; i++) {
        const sreq *c = s->running[i];
        if (!may_give_way(s, c, r) || c->tn == most)
            continue;
        double spw = slots_per_weight(s, c->tn, -1);
        if (!most || spw > most_spw) {
            most = c->tn;
            most_spw = spw;
        }
    }
    if (!most || slots_per_weight(s, r->tn, 1) > most_spw)
        return -1;
    int v = -1;
    for (int i = 0; i < s->n_running; i++) {
        const sreq *c = s->running[i];
        if (c->tn == most && may_give_way(s, c, r) && (v < 0 || c->t_submit >= s->running[v]->t_submit))
            v = i;
    }
    const sreq *c = s->running[v];
    int n = s->n_running - 1, free_blocks = rt_kv_blocks_free(s->kv) + rt_seq_blocks_freeable(c->seq);
    promised -= rt_seq_blocks_needed(c->seq, c->n_tokens - c->n_done);
    return n > 0 && blocks + promised + n > free_blocks ? -1 : v;
}

static int promised_blocks(const rt_sched *s)
{
    int promised = 0;
    for (int i = 0; i < s->n_running; i++) {
        const sreq *r = s->running[i];
        promised += rt_seq_blocks_needed(r->seq, r->n_tokens - r->n_done);
    }
    return promised;
}

/* A newly admitted request takes what the prefix cache holds of its
 * tokens, all but the last: that one's logits draw the next token. */
static void reuse_prefix(rt_sched *s, sreq *r)
{
    r->n_done = rt_seq_reuse_prefix(r->seq, r->tokens, r->n_tokens - 1);
    if (r->n_gen == 0)
        r->n_cached = r->n_done;
    pthread_mutex_lock(&s->mu);
    s->stats.prompt_tokens_cached += (uint64_t)r->n_done;
    s->stats.prompt_tokens_computed += (uint64_t)(r->n_tokens - r->n_done);
    pthread_mutex_unlock(&s->mu);
}

/* Admits waiting requests, interactive first (batch ones once aged: see
 * next_queue), while there is a sequence slot and KV room for the whole of
 * the request's known tokens plus one block of headroom per running
 * sequence (so decodes rarely preempt).
 * Sequences take their blocks as their prompts are prefilled, chunk by chunk,
 * so the room counted is what is free less what the running sequences'
 * known tokens will still take: without it, long prompts admitted together
 * each saw the whole free pool and preempted one another.
 * An interactive request that finds no slot or room does not wait for
 * running batch work to end: the youngest batch sequence gives way, and is
 * recomputed when it is admitted again. */
/* A grammar mask: a bit for each token of the tokenizer's (which the
 * matcher fills) or of the logits', the more. */
static size_t mask_bytes(const rt_sched *s)
{
    int32_t n = rt_tokenizer_n_vocab(s->tok) > s->n_vocab ? rt_tokenizer_n_vocab(s->tok) : s->n_vocab;
    return ((size_t)n + 31) / 32 * sizeof(uint32_t);
}

/* A request's sampler, at admission; a resumed one's (n_gen > 0 and no
 * sampler yet) as its tokens left it. */
static rt_sampler *new_sampler(const rt_sched *s, const sreq *r)
{
    rt_sampler *smp = rt_sampler_new(&r->sampling, s->n_vocab);
    if (smp && r->n_gen)
        rt_sampler_resume(smp, r->tokens + r->n_prompt, r->n_gen);
    return smp;
}

static void admit(rt_sched *s)
{
    int admitted[2] = {0, 0}, promised = promised_blocks(s);
    double now = gw_mono_s();
    /* the request a preemption made room for: the next one picked could be
     * the one that gave way, and the two swap places for ever */
    sreq *made_room_for = NULL;
    for (;;) {
        queue *q = next_queue(s, now);
        sreq *prev = NULL, *r = q->head;
        if (made_room_for) {
            r = made_room_for;
            q = &s->waiting[r->prio];
            for (sreq *p = q->head; p != r; p = p->next)
                prev = p;
        } else if (!r) {
            break;
        } else if (q != &s->waiting[RT_PRIO_BATCH] || !aged(s, r, now)) {
            /* an aged batch request goes first whatever its tenant: aging
             * is what keeps batch work from starving */
            r = fair_pick(q, &prev);
        }
        made_room_for = NULL;
        if (atomic_load(&r->qstate) == Q_EVICTED) { /* pushed out since intake */
            q_remove(q, prev, r);
            finish_error(s, r, -EAGAIN);
            continue;
        }
        int blocks = blocks_for(s, r->n_tokens);
        if (s->n_running >= s->o.max_seqs ||
            (blocks + promised + s->n_running > rt_kv_blocks_free(s->kv) && s->n_running > 0)) {
            int v = r->prio == RT_PRIO_INTERACTIVE ? youngest(s, true) : -1;
            bool for_share = v < 0 || !preemption_makes_room(s, blocks, promised);
            if (for_share)
                v = fair_victim(s, r, blocks, promised);
            if (v < 0)
                break;
            s->running[v]->tn->preempted_new += for_share;
            preempt_at(s, v);
            promised = promised_blocks(s);
            made_room_for = r;
            continue;
        }
        if (!take_fresh(s, r)) { /* a submit pushed it out just now */
            q_remove(q, prev, r);
            finish_error(s, r, -EAGAIN);
            continue;
        }
        /* kept across a preemption, with the counts penalties read */
        if ((!r->smp && !(r->smp = new_sampler(s, r))) ||
            (r->logprobs && !r->lp_row && !(r->lp_row = malloc((size_t)s->n_vocab * sizeof(float)))) ||
            (r->grammar && !r->gm &&
             (!(r->gm = rt_gmatch_new(r->grammar)) || !(r->gmask = malloc(mask_bytes(s)))))) {
            q_remove(q, prev, r);
            admitted[r->prio]++; /* out of the queue all the same */
            finish_error(s, r, -ENOMEM);
            continue;
        }
        r->seq = rt_seq_new(s->kv, r->n_prompt + r->max_new);
        if (!r->seq)
            break;
        q_remove(q, prev, r);
        r->waited_s += now - r->t_queued;
        reuse_prefix(s, r);
        r->t_admit = gw_mono_s();
        /* Not a recompute. What the prompt had to compute, past what the
         * prefix cache gave: the estimate's new request prefills that much
         * (its whole prompt counted the cached part as work too). */
        if (r->n_gen == 0) {
            const double work = r->n_tokens - r->n_done;
            s->prompt_ewma = s->prompt_ewma > 0 ? s->prompt_ewma + EWMA_ALPHA * (work - s->prompt_ewma) : work;
        }
        s->running[s->n_running++] = r;
        admitted[r->prio]++;
        promised += blocks;
    }
    if (admitted[0] || admitted[1]) {
        pthread_mutex_lock(&s->mu);
        s->n_waiting[0] -= admitted[0];
        s->n_waiting[1] -= admitted[1];
        count_queued(s);
        s->stats.running = s->n_running;
        pthread_mutex_unlock(&s->mu);
    }
}

/* KV blocks tenant t's running requests hold, per weight. */
static double blocks_per_weight(const rt_sched *s, const tenant *t)
{
    int n = 0;
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i]->tn == t)
            n += rt_seq_blocks(s->running[i]->seq);
    return n / t->weight;
}

/* The youngest running request of the tenant holding the most KV blocks
 * per weight: the pool is what ran short, so its heaviest user gives. */
static int youngest_of_heaviest(const rt_sched *s)
{
    const tenant *most = NULL;
    double most_bpw = 0;
    for (int i = 0; i < s->n_running; i++) {
        const tenant *t = s->running[i]->tn;
        double bpw = t == most ? most_bpw : blocks_per_weight(s, t);
        if (!most || bpw > most_bpw) {
            most = t;
            most_bpw = bpw;
        }
    }
    int v = -1;
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i]->tn == most && (v < 0 || s->running[i]->t_submit >= s->running[v]->t_submit))
            v = i;
    return v;
}

/* The KV pool ran dry. The youngest running batch request not admitted
 * after a long wait gives its blocks back and waits at the head of its
 * queue to be recomputed from its tokens; where there is none, the
 * youngest of the tenant holding the most blocks per weight (with one
 * tenant, the youngest of all). Batch first: an interactive request
 * admitted after long batch jobs should not be the one that waits again;
 * then by tenant: a tenant's long contexts should not cost another's
 * stream its place. */
static void preempt_youngest(rt_sched *s)
{
    int v = youngest(s, true);
    preempt_at(s, v >= 0 ? v : youngest_of_heaviest(s));
}

static int prefill_budget(const rt_sched *s, int n_dec)
{
    return rt_sched_prefill_budget(s->o.max_batch_tokens, n_dec);
}

/* Which pass of build_batch a running request's tokens go in: decodes
 * first, then the prompts of interactive requests (and of batch ones that
 * have waited batch_max_wait_ms: in the queue, as next_queue ages them,
 * and since admission for their prompt's turn, or steady interactive
 * prompts would hold theirs back for ever), then the other batch prompts. In admission
 * order alone, a batch request's long prompt admitted first took the whole
 * budget every step, and an interactive request behind it had its first
 * token only once that prompt was done (a review measured 6 ms -> 991 ms). */
static bool decoding(const sreq *r)
{
    return r->n_done > 0 && r->n_tokens - r->n_done == 1;
}

static int batch_pass(const rt_sched *s, const sreq *r, double now)
{
    if (decoding(r))
        return 0;
    /* within each, the prompts of tenants owed work first (catch-up) */
    int p = r->prio == RT_PRIO_INTERACTIVE || waited_long(s, r->waited_s + (now - r->t_admit)) ? 1 : 2;
    return 2 * p - r->tn->owed;
}

/* Fills s->batch: every decoding sequence's one token, then prompt chunks
 * within the budget, interactive first (batch_pass). Returns the entry
 * count. */
static int build_batch(rt_sched *s)
{
    const double now = gw_mono_s();
    for (;;) {
        int n_dec = 0;
        for (int i = 0; i < s->n_running; i++)
            n_dec += decoding(s->running[i]) && !s->running[i]->held;
        int budget = prefill_budget(s, n_dec) + n_dec, n = 0, blocks = 0;
        int pool = owe_tenants(s, n_dec);
        fair_order(s, now);
        for (int pass = 0; pass < 5; pass++) {
            for (int k = 0; k < s->n_running; k++) {
                int i = s->order[k];
                sreq *r = s->running[i];
                int remaining = r->n_tokens - r->n_done;
                if (r->held || batch_pass(s, r, now) != pass)
                    continue;
                int take = remaining < budget ? remaining : budget;
                if (pass == 0)
                    take = 1; /* decodes always run: max_batch_tokens >= max_seqs */
                else
                    take += catch_up(r->tn, remaining - take, &pool);
                if (take <= 0)
                    continue;
                budget -= take;
                blocks += rt_seq_blocks_needed(r->seq, take);
                s->take[n] = i;
                s->batch[n] = (rt_batch_entry){
                    .seq = r->seq,
                    .tokens = r->tokens + r->n_done,
                    .n_tokens = take,
                    .logits = r->n_done + take == r->n_tokens ? s->logits + (size_t)n * s->n_vocab : NULL,
                };
                n++;
            }
        }
        if (blocks <= rt_kv_blocks_free(s->kv) || s->n_running <= 1)
            return n;
        preempt_youngest(s);
    }
}

static void update_stats_token(rt_sched *s, sreq *r, double now)
{
    pthread_mutex_lock(&s->mu);
    rt_sched_stats *st = &s->stats;
    if (r->n_gen == 1) {
        trace_first(s, r, now);
        double ttft = (now - r->t_submit) * 1e3, prefill = (now - r->t_admit) * 1e3;
        st->ttft_ewma_ms = st->ttft_ewma_ms ? st->ttft_ewma_ms + EWMA_ALPHA * (ttft - st->ttft_ewma_ms) : ttft;
        st->prefill_ewma_ms =
            st->prefill_ewma_ms ? st->prefill_ewma_ms + EWMA_ALPHA * (prefill - st->prefill_ewma_ms) : prefill;
    } else if (r->t_last >= r->t_admit) {
        /* not the first token after a preemption: its wait and recompute
         * are no token's time */
        double tpot = (now - r->t_last) * 1e3;
        st->tpot_ewma_ms = st->tpot_ewma_ms ? st->tpot_ewma_ms + EWMA_ALPHA * (tpot - st->tpot_ewma_ms) : tpot;
    }
    st->tokens_generated++;
    pthread_mutex_unlock(&s->mu);
    r->t_last = now;
}

/* Grammar-constrained sampling: tokens the grammar does not allow next
 * get no chance, nor do the model's rows past the tokenizer's vocabulary.
 * Where it allows none (the vocabulary cannot write what it needs), only
 * the end-of-generation tokens are left; where the matcher cannot say (out
 * of memory), the logits are left alone, and advance() below ends the
 * request at the token it refuses. */
static void constrain(rt_sched *s, sreq *r, float *logits)
{
    int rc = r->gmask_ready ? r->gmask_rc : rt_gmatch_mask(r->gm, r->gmask);
    r->gmask_ready = false;
    if (rc == -ENOMEM)
        return;
    const int32_t n_tok =
        rt_tokenizer_n_vocab(s->tok) < s->n_vocab ? rt_tokenizer_n_vocab(s->tok) : s->n_vocab;
    for (int32_t t = n_tok; t < s->n_vocab; t++)
        logits[t] = -INFINITY;
    if (rc == -E2BIG) {
        for (int32_t t = 0; t < n_tok; t++)
            if (!rt_tokenizer_is_eog(s->tok, t))
                logits[t] = -INFINITY;
        return;
    }
    const uint32_t *m = r->gmask;
    for (int32_t w = 0; w < (n_tok + 31) / 32; w++) {
        uint32_t bits = m[w];
        if (bits == UINT32_MAX)
            continue;
        int32_t base = w * 32, end = base + 32 < n_tok ? base + 32 : n_tok;
        for (int32_t t = base; t < end; t++)
            if (!((bits >> (t - base)) & 1))
                logits[t] = -INFINITY;
    }
}

/* Batch entry i's next token, from its logits. The entries' samplers and
 * logits are their own, so the rows are sampled on all compute threads:
 * a row of 32000 logits takes ~60 us at temperature 1, ~190 us with top_p
 * on flat logits, ~12 us greedy. */
static void sample_item(void *arg, int i)
{
    rt_sched *s = arg;
    float *logits = s->batch[i].logits;
    if (!logits)
        return;
    sreq *r = s->running[s->take[i]];
    /* the sampler works on the row in place: log-probabilities are of the
     * model's own logits, so they get a copy */
    if (r->lp_row)
        memcpy(r->lp_row, logits, (size_t)s->n_vocab * sizeof(float));
    if (r->first_logits) {
        memcpy(r->first_logits, logits, (size_t)s->n_vocab * sizeof(float));
        r->first_logits = NULL;
    }
    if (r->gm)
        constrain(s, r, logits);
    s->sampled[i] = rt_sampler_sample(r->smp, logits);
    if (r->lp_row)
        rt_logprobs(r->lp_row, s->n_vocab, s->sampled[i], r->top_logprobs, &r->lp);
}

/* The last tokens of r whose text lies wholly in the stop string that
 * matched: walking back, while the text of the tokens walked over fits in
 * the bytes fed from the match on. A token the match begins inside of keeps
 * its place in the answer. */
static int stop_tokens(const rt_sched *s, const sreq *r)
{
    size_t tail = rt_stop_tail_len(r->stop), seen = 0;
    int k = 0;
    while (k < r->n_gen) {
        size_t n = 0;
        const char *piece = rt_tokenizer_piece(s->tok, r->tokens[r->n_tokens - 1 - k], &n);
        seen += piece ? n : 0;
        if (seen > tail)
            break;
        k++;
    }
    return k;
}

/* The event's lp_ready (see rt_sched_event), now that `out` more bytes of
 * r's text go out. */
static int lp_ready(const rt_sched *s, sreq *r, size_t out, bool done, bool matched)
{
    if (done)
        return r->n_gen - (matched ? stop_tokens(s, r) : 0);
    r->text_out += out;
    const int32_t *gen = r->tokens + r->n_tokens - r->n_gen;
    while (r->lp_ready < r->n_gen && r->lp_ready_at < r->text_out) {
        size_t n = 0;
        const char *piece = rt_tokenizer_piece(s->tok, gen[r->lp_ready++], &n);
        r->lp_ready_at += piece ? n : 0;
    }
    return r->lp_ready;
}

/* Reports r's next token t. Returns true when r has finished (and has been
 * reported and freed). */
static bool advance(rt_sched *s, sreq *r, int32_t t, double now)
{
    rt_sampler_accept(r->smp, t);
    r->tokens[r->n_tokens++] = t;
    r->n_gen++;
    update_stats_token(s, r, now);

    const char *reason = NULL;
    bool matched = false;
    /* A grammar's text is complete when it allows nothing more; a token
     * it refused (its matcher out of memory) ends the answer where it is */
    bool grammar_done = r->gm && (rt_gmatch_accept(r->gm, t) != 0 || rt_gmatch_must_end(r->gm));
    if ((!r->ignore_eos || r->gm) && rt_tokenizer_is_eog(s->tok, t)) {
        reason = "stop";
    } else {
        size_t n = 0;
        const char *piece = rt_tokenizer_piece(s->tok, t, &n);
        if (piece && n > 0 && rt_stop_feed(r->stop, piece, n)) {
            if (rt_stop_error(r->stop)) {
                /* No memory to hold the text back: an error, not a stop
                 * the client would take for the model's. */
                finish_error(s, r, -ENOMEM);
                return true;
            }
            matched = true;
            reason = "stop";
        }
    }
    if (!reason && grammar_done)
        reason = "stop";
    if (!reason && (r->n_gen >= r->max_new || r->n_tokens >= s->n_ctx))
        reason = "length";
    size_t len;
    const char *text = rt_stop_take(r->stop, reason && !matched, &len);
    rt_sched_event ev = {.kind = reason ? RT_EV_DONE : RT_EV_TEXT,
                         .text = text,
                         .text_len = len,
                         .token = t,
                         .finish_reason = reason,
                         .lp_ready = r->lp_row ? lp_ready(s, r, len, reason != NULL, matched) : 0,
                         .logprobs = r->lp_row ? &r->lp : NULL};
    emit(r, &ev);
    if (reason) {
        if (r->max_new > 0)
            s->gen_frac += EWMA_ALPHA * ((double)r->n_gen / r->max_new - s->gen_frac);
        pthread_mutex_lock(&s->mu);
        s->stats.requests_done++;
        s->stats.done_tokens += (uint64_t)r->n_gen;
        pthread_mutex_unlock(&s->mu);
        sreq_free(r);
    }
    return reason != NULL;
}

/* A step is timed from its start to the next one's (or to the loop going
 * idle): what a request waiting behind it sees, the loop's own work
 * (intake, admission, stats, the events to the HTTP thread) included.
 * Timed forward and sampling alone, a flooded worker's estimate read
 * half of what its requests waited. */
static void fit_close(rt_sched *s, double now)
{
    if (s->fit_t0 > 0 && now >= s->fit_t0) {
        if (s->trace) {
            s->tr_real_ms += (now - s->fit_t0) * 1e3;
            s->tr_pred_ms += rt_step_fit_ms(&s->fit, s->fit_tokens);
        }
        rt_step_fit_add(&s->fit, s->fit_tokens, (now - s->fit_t0) * 1e3);
    }
    s->fit_t0 = 0;
}

/* The grammar masks of the step's sampled requests depend on the tokens
 * accepted so far only, not on this step's logits: where the forward pass
 * runs off the CPU (a GPU), a thread of their own computes them while it
 * runs, and sampling finds them ready. On the CPU the pass holds every
 * core, so the masks are computed with the sampling, on the compute
 * threads (bench_grammar: ~35 us a sequence at 32k, <1% of a 110M-class
 * model's batch-16 step). */
static void *masks_run(void *arg)
{
    rt_sched *s = arg;
    for (int i = 0; i < s->n_masking; i++) {
        sreq *r = s->masking[i];
        r->gmask_rc = rt_gmatch_mask(r->gm, r->gmask);
        r->gmask_ready = true;
    }
    return NULL;
}

static bool masks_start(rt_sched *s, int n, pthread_t *t)
{
    if (!s->overlap_masks)
        return false;
    s->n_masking = 0;
    for (int i = 0; i < n; i++) {
        sreq *r = s->running[s->take[i]];
        if (s->batch[i].logits && r->gm)
            s->masking[s->n_masking++] = r;
    }
    /* without a thread the masks are computed at sampling, as on the CPU */
    return s->n_masking && !pthread_create(t, NULL, masks_run, s);
}

/* One forward pass over the batch; the number of entries it had (0: every
 * running request is held). */
static int step(rt_sched *s)
{
    int n = build_batch(s);
    if (n == 0)
        return 0;
    double t0 = gw_mono_s();
    fit_close(s, t0);
    pthread_t masker;
    bool masking = masks_start(s, n, &masker);
    int rc = rt_model_forward(s->model, s->batch, n);
    if (masking)
        pthread_join(masker, NULL);
    if (rc == 0)
        rt_model_parallel_for(s->model, n, sample_item, s);
    double now = gw_mono_s();
    if (rc == 0) {
        s->fit_t0 = t0;
        s->fit_tokens = 0;
        for (int i = 0; i < n; i++)
            s->fit_tokens += s->batch[i].n_tokens;
    }
    for (int i = 0; i < n; i++) {
        sreq *r = s->running[s->take[i]];
        if (rc) {
            /* Blocks cannot run out with the KV accounting above; memory
             * for activations can. Fail the batch's requests rather than
             * spin on it: -ENOMEM (worth a retry), -ENOTRECOVERABLE (the
             * device is lost: the process must go) or -EIO. */
            fprintf(stderr, "scheduler: forward pass failed (%d); failing request %llu\n", rc,
                    (unsigned long long)r->id);
            finish_error(s, r, rc == -ENOMEM || rc == -ENOTRECOVERABLE ? rc : -EIO);
            s->running[s->take[i]] = NULL;
            continue;
        }
        charge(r, r->n_done, r->n_done + s->batch[i].n_tokens);
        r->n_done += s->batch[i].n_tokens;
        rt_seq_cache_blocks(r->seq, r->tokens);
        if (s->batch[i].logits && advance(s, r, s->sampled[i], now))
            s->running[s->take[i]] = NULL;
    }
    compact_running(s);
    age_recent(s);
    return n;
}

/* Tokens r is expected to generate in all: the finished requests lately
 * generated gen_frac of their max_new (1 where every one runs to length). */
static int expected_gen(const rt_sched *s, const sreq *r)
{
    double e = s->gen_frac * r->max_new + 0.5;
    int n = e < INT_MAX / 2 ? (int)e : INT_MAX / 2;
    return n > r->n_gen + 1 ? n : r->n_gen + 1;
}

static rt_est_seq est_seq_of(const rt_sched *s, const sreq *r, double now)
{
    int left = expected_gen(s, r) - r->n_gen; /* >= 1 */
    if (decoding(r))
        return (rt_est_seq){0, left, false};
    /* One not yet admitted will take what the prefix cache holds of its
     * prompt (reuse_prefix): counted whole, a queue of requests resending
     * one conversation read as that much prefill. */
    int done = r->seq ? r->n_done : rt_kv_prefix_peek(s->kv, r->tokens, r->n_tokens - 1);
    /* the prompt's end gives one */
    return (rt_est_seq){r->n_tokens - done, left - 1, prompt_aged(s, r, now)};
}

/* Room in est_q (and est_q_tn) for n entries (the queue may outgrow
 * max_queue by what is in the inbox); false on no memory (the estimate
 * then counts fewer). */
static bool est_room(rt_sched *s, int n)
{
    if (n <= s->est_q_cap)
        return true;
    int cap = n + 16;
    rt_est_seq *q = realloc(s->est_q, (size_t)cap * sizeof(*q));
    if (q)
        s->est_q = q;
    int *tn = q ? realloc(s->est_q_tn, (size_t)cap * sizeof(*tn)) : NULL;
    if (!tn)
        return false;
    s->est_q_tn = tn;
    s->est_q_cap = cap;
    return true;
}

/* The replay's tenant for `name` (weight w): the table's (est_idx), one
 * made for a tenant still in the inbox (level with the least present, as
 * link_tenant will make it), or -1 on no memory. */
static int est_tenant(rt_sched *s, int *n_tn, const char *name, double w)
{
    for (int i = 0; i < *n_tn; i++)
        if (!strcmp(s->est_tn_name[i], name))
            return i;
    if (*n_tn == s->est_tn_cap) {
        int cap = 2 * s->est_tn_cap + 8;
        rt_est_tenant *t = realloc(s->est_tn, (size_t)cap * sizeof(*t));
        if (t)
            s->est_tn = t;
        const char **nm = t ? realloc(s->est_tn_name, (size_t)cap * sizeof(*nm)) : NULL;
        if (!nm)
            return -1;
        s->est_tn_name = nm;
        s->est_tn_cap = cap;
    }
    double least = least_vt(s, NULL), recent = 0;
    for (const tenant *t = s->tenants; t; t = t->next) /* kept for its recent work (sweep_tenants) */
        if (!strcmp(t->name, name))
            recent = t->recent;
    s->est_tn[*n_tn] = (rt_est_tenant){.vt = least > 0 ? least : 0, .weight = w > 0 ? w : 1, .recent = recent};
    s->est_tn_name[*n_tn] = name;
    return (*n_tn)++;
}

/* est_tn: the tenants with requests here, with their virtual times and
 * weights (each one's est_idx set). Returns their count; -1 on no memory. */
static int est_tenants(rt_sched *s)
{
    int n_tn = 0;
    for (tenant *t = s->tenants; t; t = t->next) {
        t->est_idx = -1;
        if (t->n_present > 0 && (t->est_idx = est_tenant(s, &n_tn, t->name, t->weight)) < 0)
            return -1;
        if (t->est_idx >= 0) {
            s->est_tn[t->est_idx].vt = t->vt;
            s->est_tn[t->est_idx].recent = t->recent;
        }
    }
    return n_tn;
}

/* Adds r to est_q (its tenant in est_q_tn: tn, an index in est_tn, or -1
 * when none was made); false when there is no room. */
static bool est_add(rt_sched *s, int *n_q, const sreq *r, int tn, long *ahead, double now)
{
    if (!est_room(s, *n_q + 1))
        return false;
    s->est_q[*n_q] = est_seq_of(s, r, now);
    s->est_q_tn[*n_q] = tn;
    *ahead += s->est_q[(*n_q)++].prefill_left;
    return true;
}

/* The replay's input: est_run gets the running requests, est_q the
 * interactive ones waiting that may go before `target` (NULL: all of them
 * and the inbox's, which come next; else all but target and its tenant's
 * after it: fair share takes a tenant's requests in order), and est_tn
 * their tenants (*n_tn of them; -1: no memory for them). Returns est_q's
 * count; *n_run and *ahead (the prompt tokens still to compute) are set. */
static int est_fill(rt_sched *s, const sreq *target, int *n_run, int *n_tn, long *ahead)
{
    int n_q = 0;
    const double now = gw_mono_s();
    *ahead = 0;
    *n_run = 0;
    *n_tn = est_tenants(s);
    for (int i = 0; i < s->n_running; i++) {
        s->est_run_tn[*n_run] = s->running[i]->tn->est_idx;
        s->est_run[*n_run] = est_seq_of(s, s->running[i], now);
        *ahead += s->est_run[(*n_run)++].prefill_left;
    }
    bool past = false;
    for (const sreq *r = s->waiting[0].head; r; r = r->next) {
        past |= r == target;
        if (r != target && !(past && r->tn == target->tn) && !est_add(s, &n_q, r, r->tn->est_idx, ahead, now))
            break;
    }
    if (target)
        return n_q;
    pthread_mutex_lock(&s->mu);
    for (const sreq *r = s->inbox.head; r; r = r->next) {
        int tn = *n_tn >= 0 ? est_tenant(s, n_tn, r->tn->name, r->tn->weight) : -1;
        if (tn < 0)
            *n_tn = -1;
        if (r->prio == RT_PRIO_INTERACTIVE && !est_add(s, &n_q, r, tn, ahead, now))
            break;
    }
    pthread_mutex_unlock(&s->mu);
    return n_q;
}

/* The replay (sched_est.h) over what est_fill gave, for a new request of
 * `prompt` tokens of tenant tn (-1: the present one served last), in fair
 * order; in arrival order when there was no memory for the tenants. */
static double est_replay(rt_sched *s, int n_run, int n_q, int n_tn, int prompt, int tn)
{
    if (n_tn >= 0 && tn < 0) {
        for (int t = 0; t < n_tn; t++)
            if (tn < 0 || s->est_tn[t].vt > s->est_tn[tn].vt)
                tn = t;
        if (tn < 0) /* none is here: one of its own */
            tn = est_tenant(s, &n_tn, "", 1);
    }
    if (n_tn < 0 || tn < 0)
        return rt_est_ttft(&s->fit, s->o.max_seqs, s->o.max_batch_tokens, s->est_run, n_run, s->est_q, n_q, prompt,
                           EST_MAX_WORK);
    return rt_est_ttft_fair(&s->fit, s->o.max_seqs, s->o.max_batch_tokens, s->est_run, s->est_run_tn, n_run,
                            s->est_q, s->est_q_tn, n_q, s->est_tn, n_tn, prompt, tn, EST_MAX_WORK);
}

/* The TTFT estimate (sched_est.h) for an interactive request joining now:
 * behind the running requests, with the interactive ones waiting (batch
 * ones wait behind it), the inbox's included, in the order fair share
 * takes them. Routing knows no tenant's place in a worker's queue, so
 * the estimate is for the tenant here served last (the greatest virtual
 * time): an upper bound for those present; a tenant with nothing here
 * starts level with the least and goes sooner. */
static void update_estimate(rt_sched *s, double now)
{
    if (now - s->est_t < EST_EVERY_S || !s->est_run)
        return;
    s->est_t = now;
    int n_run, n_tn;
    long ahead;
    int n_q = est_fill(s, NULL, &n_run, &n_tn, &ahead);
    int prompt = s->prompt_ewma >= 1 ? (int)(s->prompt_ewma + 0.5) : 1;
    double est = est_replay(s, n_run, n_q, n_tn, prompt, -1);
    pthread_mutex_lock(&s->mu);
    rt_sched_stats *st = &s->stats;
    st->est_ttft_ms = est;
    st->prompt_tokens_ahead = ahead < INT_MAX ? (int)ahead : INT_MAX;
    st->est_prompt_tokens = prompt;
    st->step_base_ms = s->fit.base_ms;
    st->step_token_ms = s->fit.token_ms;
    const int full = rt_sched_prefill_budget(s->o.max_batch_tokens, 0);
    const double full_ms = rt_step_fit_ms(&s->fit, full);
    st->prefill_tokens_per_s = full_ms > 0 ? full * 1000.0 / full_ms : 0;
    pthread_mutex_unlock(&s->mu);
}

/* Under mu: the tenants' figures as of this step. */
static void publish_tenants(rt_sched *s, double now)
{
    /* those present are active now, so that no newcomer's takes their place */
    for (int i = 0; i < s->n_figs; i++) {
        tfig *f = &s->figs[i];
        f->st.running = f->st.queued = 0;
        for (const tenant *t = s->tenants; t; t = t->next)
            if (t->n_present > 0 && !strcmp(t->name, f->st.name))
                f->active = now;
    }
    s->other.st.running = s->other.st.queued = s->other.st.folded = 0;
    for (tenant *t = s->tenants; t; t = t->next) {
        tfig *f = t->n_present > 0 || t->tokens_new || t->preempted_new ? fig_of(s, t->name, now) : NULL;
        if (!f)
            continue;
        int running = 0;
        for (int i = 0; i < s->n_running; i++)
            running += s->running[i]->tn == t;
        if (f == &s->other) /* its weight says nothing: its tenants' differ */
            f->st.folded++;
        else
            f->st.weight = t->weight;
        f->st.running += running;
        f->st.queued += t->n_present - running;
        f->st.tokens += t->tokens_new;
        f->st.preempted += t->preempted_new;
        t->tokens_new = t->preempted_new = 0;
    }
}

int rt_sched_tenants(rt_sched *s, rt_sched_tenant_stats *out, int max)
{
    pthread_mutex_lock(&s->mu);
    int n = s->n_figs < max ? s->n_figs : max;
    for (int i = 0; i < n; i++)
        out[i] = s->figs[i].st;
    if (s->other_used && n < max)
        out[n++] = s->other.st;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* INFERGATE_EST_TRACE: the interactive requests intake just took in get
 * the replay's estimate for their own prompt behind what is ahead of them
 * now, and the step clocks (trace_first prints them at the first token). */
static void trace_intake(rt_sched *s)
{
    double now = gw_mono_s();
    for (sreq *r = s->waiting[0].head; r; r = r->next) {
        if (r->t_intake > 0)
            continue;
        int n_run, n_tn;
        long ahead;
        int n_q = est_fill(s, r, &n_run, &n_tn, &ahead);
        r->t_intake = now;
        r->tr_real0 = s->tr_real_ms;
        r->tr_pred0 = s->tr_pred_ms;
        int prompt = est_seq_of(s, r, now).prefill_left;
        r->tr_fresh = est_replay(s, n_run, n_q, n_tn, prompt, r->tn->est_idx);
    }
}

/* One line per interactive request's first token: what was estimated for
 * it (published at submission, replayed at intake) against its TTFT, and
 * where the difference lies: the steps' real time against the fit's. */
static void trace_first(const rt_sched *s, const sreq *r, double now)
{
    if (!s->trace || r->t_intake <= 0)
        return;
    fprintf(stderr,
            "est_trace id=%llu max_new=%d prompt=%d cached=%d pub=%.1f fresh=%.1f ttft=%.1f intake=%.1f wait=%.1f "
            "prefill=%.1f steps=%.1f fitted=%.1f base=%.3f per_token=%.4f\n",
            (unsigned long long)r->id, r->max_new, r->n_prompt, r->n_cached, r->tr_pub, r->tr_fresh,
            (now - r->t_submit) * 1e3, (r->t_intake - r->t_submit) * 1e3, (r->t_admit - r->t_submit) * 1e3,
            (now - r->t_admit) * 1e3, s->tr_real_ms - r->tr_real0, s->tr_pred_ms - r->tr_pred0, s->fit.base_ms,
            s->fit.token_ms);
}

/* With nothing running or waiting, the step figures relax toward their
 * floors (sched_est.h: an idle worker must not keep a flood's estimate). */
static void relax_idle(rt_sched *s)
{
    pthread_mutex_lock(&s->mu);
    bool idle = s->n_running == 0 && !s->n_waiting[0] && !s->n_waiting[1]; /* inbox included */
    pthread_mutex_unlock(&s->mu);
    double now = gw_mono_s();
    if (idle && s->idle_t > 0)
        rt_step_fit_relax(&s->fit, now - s->idle_t);
    s->idle_t = idle ? now : 0;
}

static void publish_stats(rt_sched *s)
{
    double now = gw_mono_s();
    update_estimate(s, now);
    pthread_mutex_lock(&s->mu);
    publish_tenants(s, now);
    rt_sched_stats *st = &s->stats;
    st->running = s->n_running;
    st->kv_blocks_free = rt_kv_blocks_free(s->kv);
    st->kv_blocks_cached = rt_kv_blocks_cached(s->kv);
    st->kv_blocks_evictable = rt_kv_blocks_evictable(s->kv);
    if (now - s->rate_t0 >= 1.0) {
        st->tokens_per_s = (double)(st->tokens_generated - s->rate_tokens0) / (now - s->rate_t0);
        s->rate_t0 = now;
        s->rate_tokens0 = st->tokens_generated;
    }
    pthread_mutex_unlock(&s->mu);
}

static void *run(void *arg)
{
    rt_sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        bool stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stopping)
            break;
        intake(s);
        admit(s);
        if (s->n_running > 0 && step(s) > 0) {
            publish_stats(s);
            continue;
        }
        fit_close(s, gw_mono_s());
        relax_idle(s);
        publish_stats(s);
        pthread_mutex_lock(&s->mu);
        if (!s->stopping && !s->inbox.n && !s->n_cancels && !s->n_holds) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            long ns = ts.tv_nsec + IDLE_WAIT_MS * 1000000L;
            ts.tv_sec += ns / 1000000000L;
            ts.tv_nsec = ns % 1000000000L;
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
        pthread_mutex_unlock(&s->mu);
    }
    /* Shutting down: everyone still here is told. */
    while (s->n_running > 0) {
        sreq *r = s->running[--s->n_running];
        finish_error(s, r, -ECANCELED);
    }
    for (int p = 0; p < 2; p++) {
        sreq *r;
        while ((r = q_pop(&s->waiting[p])))
            finish_error(s, r, -ECANCELED);
    }
    return NULL;
}

rt_sched *rt_sched_new(rt_model *m, const rt_sched_opts *o, char *err, size_t err_len)
{
    rt_sched *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    s->o = *o;
    if (s->o.batch_max_wait_ms < 0 || s->o.prompt_max_wait_ms < 0) {
        snprintf(err, err_len, "%s must be >= 0",
                 s->o.batch_max_wait_ms < 0 ? "batch-max-wait-ms" : "prompt-max-wait-ms");
        free(s);
        return NULL;
    }
    if (s->o.max_seqs < 1 || s->o.max_queue < 0 || s->o.block_tokens < 1 ||
        s->o.max_batch_tokens < s->o.max_seqs) {
        snprintf(err, err_len, "max-seqs must be >= 1 and max-batch-tokens (%d) >= max-seqs (%d)",
                 s->o.max_batch_tokens, s->o.max_seqs);
        free(s);
        return NULL;
    }
    s->model = m;
    s->tok = rt_model_tokenizer(m);
    s->n_ctx = rt_model_hparams(m)->n_ctx_train;
    s->n_vocab = rt_model_hparams(m)->n_vocab;
    s->kv = rt_kv_new(m, o->kv_bytes, o->block_tokens, o->kv_type, err, err_len);
    if (!s->kv) {
        free(s);
        return NULL;
    }
    int cap = s->o.max_seqs;
    s->running = calloc((size_t)cap, sizeof(sreq *));
    s->batch = calloc((size_t)cap, sizeof(rt_batch_entry));
    s->take = calloc((size_t)cap, sizeof(int));
    s->order = calloc((size_t)cap, sizeof(int));
    s->logits = malloc((size_t)cap * s->n_vocab * sizeof(float));
    s->sampled = calloc((size_t)cap, sizeof(int32_t));
    s->est_run = calloc((size_t)cap, sizeof(rt_est_seq));
    s->est_run_tn = calloc((size_t)cap, sizeof(int));
    s->masking = calloc((size_t)cap, sizeof(sreq *));
    s->gen_frac = 1;
    s->trace = getenv("INFERGATE_EST_TRACE") != NULL;
    rt_device_info dev;
    rt_model_device_info(m, &dev);
    s->overlap_masks = o->overlap_masks > 0 || (o->overlap_masks < 0 && strcmp(dev.kind, "cpu"));
    if (!s->running || !s->batch || !s->take || !s->order || !s->logits || !s->sampled || !s->est_run || !s->est_run_tn ||
        !s->masking) {
        snprintf(err, err_len, "out of memory for %d sequences", cap);
        goto fail;
    }
    if (s->o.prefix_cache) {
        char why[256];
        if (rt_kv_prefix_enable(s->kv, why, sizeof(why)))
            fprintf(stderr, "scheduler: %s\n", why);
    }
    s->stats.prefix_cache = rt_kv_prefix_on(s->kv);
    s->stats.kv_blocks_total = rt_kv_blocks_total(s->kv);
    s->stats.kv_blocks_free = s->stats.kv_blocks_total;
    s->stats.kv_block_tokens = o->block_tokens;
    s->stats.kv_type = rt_kv_type(s->kv);
    s->stats.max_seqs = o->max_seqs;
    s->stats.max_queue = o->max_queue;
    s->stats.max_batch_tokens = o->max_batch_tokens;
    s->rate_t0 = gw_mono_s();
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&s->thread, NULL, run, s)) {
        snprintf(err, err_len, "cannot start the compute thread");
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        goto fail;
    }
    return s;
fail:
    free(s->est_run);
    free(s->est_run_tn);
    free(s->masking);
    free(s->running);
    free(s->batch);
    free(s->take);
    free(s->order);
    free(s->logits);
    free(s->sampled);
    rt_kv_free(s->kv);
    free(s);
    return NULL;
}

void rt_sched_free(rt_sched *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    sreq *r;
    while ((r = q_pop(&s->inbox)))
        finish_error(s, r, -ECANCELED);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s->cancels);
    free(s->holds);
    free(s->est_run);
    free(s->est_run_tn);
    free(s->masking);
    free(s->est_q);
    free(s->est_q_tn);
    free(s->est_tn);
    free(s->est_tn_name);
    free(s->running);
    free(s->batch);
    free(s->take);
    free(s->order);
    free(s->logits);
    free(s->sampled);
    while (s->tenants) {
        tenant *t = s->tenants;
        s->tenants = t->next;
        free(t);
    }
    while (s->qtenants) { /* the requests it listed are gone */
        qtenant *t = s->qtenants;
        s->qtenants = t->next;
        free(t);
    }
    rt_kv_free(s->kv);
    free(s);
}
