/* Continuous-batching scheduler: one compute thread drives a model over
 * many requests. Every step runs one forward pass over all running
 * sequences (one token each) plus as many prompt tokens of admitted
 * requests as the max_batch_tokens budget leaves (chunked prefill), so a
 * long prompt never freezes the streams that are decoding. Requests join
 * and leave between steps.
 *
 * KV memory is paged (rt_kv): a sequence grows block by block. When the
 * pool runs dry, the most recently submitted batch sequence (one that had
 * not waited batch_max_wait_ms when admitted), or else the most recently
 * submitted of the tenant holding the most blocks per weight (see fair
 * share below), is preempted: its blocks go back and it waits at the
 * head of the queue to be recomputed
 * (prompt plus the tokens it already produced), so nothing it streamed
 * changes. New requests wait while the pool is short: a request is admitted
 * when the pool has room for its known tokens on top of what the running
 * sequences' known tokens will still take. An interactive request that
 * finds no slot or room takes them from the youngest running batch
 * request (the same kind), which is recomputed in its turn.
 *
 * Fair share between tenants (weighted fair queuing). Each request names
 * the tenant it is served for, with that tenant's weight. A tenant is
 * charged every token a step computes for it, prompt (prefill chunks and
 * recomputes) and generated alike, divided by its weight: its virtual
 * time. Priority comes first: the interactive queue is admitted from before
 * the batch one (aging as above); within the queue chosen, the waiting
 * request of the tenant with the least virtual time goes next (FIFO within
 * a tenant), and prompt chunks share each step's budget by tenant in the
 * same order (within a tenant, shortest remaining prompt first, aged ones
 * before: prompt_max_wait_ms).
 * A tenant that comes back after an absence starts level with the least
 * of those present, with no credit for its idle time (its debt, if it had
 * one, is kept while others are present). Work conserving: with one tenant present it gets every
 * slot. When the slots are full, a waiting request whose tenant holds
 * fewer slots per weight than another takes one from it (the youngest of
 * that tenant's requests of its own priority or lower, recomputed in its
 * turn) as long as, slots divided by weight, it still holds no more than
 * the tenant it took from: otherwise a tenant with every slot would hold
 * them until its streams end, and a newcomer would wait for that.
 *
 * Catch-up. Fair queuing alone gives a light tenant (one request at a
 * time beside another's flood) at most about half of each step while its
 * prompt runs, and the prefill budget that keeps streams' token times even
 * spreads that prompt over several steps: its first token came 2-3x later
 * than alone. Yet over the last ~100 steps it used far less than its
 * share. So each tenant's recent work is counted (tokens computed for it,
 * decayed by RT_SCHED_RECENT_DECAY a step), and a tenant present whose
 * recent work is below its weight's share of all present tenants' is owed
 * the difference (rt_sched_owed): its prompts go first, and may take up to
 * that many tokens on top of the step's budget, within
 * rt_sched_catchup_budget (as many again as the step holds: such a step
 * at most doubles, and so do the decoding streams' token times for it,
 * once per light request). With one tenant present nobody is owed and
 * the steps are as before. A tenant that leaves is remembered while its
 * recent work counts, so it is not owed afresh when it comes back.
 *
 * The queue is shared the same way (longest-queue drop, as fair queuing
 * drops from the fattest flow). Each priority's queue holds max_queue
 * requests, whoever sent them: a lone tenant may fill it. When it is full,
 * a request whose tenant, with it, would hold fewer never-admitted waiting
 * requests per weight than the tenant holding the most takes the place of
 * that tenant's youngest such request, which is answered ERROR -EAGAIN
 * (the 429 it would have had arriving now; a gateway sends it to another
 * worker). Else it is refused (-EAGAIN) as before. So a tenant flooding
 * the queue cannot shut another out of it, and no request that has begun
 * (a preempted one waiting to be recomputed) is ever pushed out.
 *
 * Threads: submit, cancel and stats may be called from any thread. Event
 * callbacks run on the compute thread (save the final errors rt_sched_free
 * gives requests it finds not yet taken in, on its caller's); they must not
 * block and must copy what they keep. Every accepted request gets exactly one final event
 * (DONE or ERROR), after which its id is dead. */
#ifndef RT_SCHED_H
#define RT_SCHED_H

#include "kernels/kn.h"
#include "runtime/sampler.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rt_model rt_model;
typedef struct rt_grammar rt_grammar;
typedef struct rt_sched rt_sched;

typedef struct rt_sched_opts {
    size_t kv_bytes;      /* KV pool size */
    int block_tokens;     /* positions per KV block (16) */
    kn_type kv_type;      /* KV element type: KN_TYPE_F16, or KN_TYPE_Q8_0 (rt_kv_new) */
    int max_seqs;         /* sequences running at once (32) */
    int max_batch_tokens; /* tokens per forward pass (512) */
    int max_queue;        /* requests of one priority waiting to start; past it submit says -EAGAIN (64) */
    /* A batch request waiting this long takes its turn with the
     * interactive ones, oldest first, so a steady interactive load cannot
     * starve it (30000; 0: at once, which is one queue by age). */
    int batch_max_wait_ms;
    /* A step's prompt budget goes, within a tenant and priority class, to
     * the prompts with the fewest tokens left to compute first (a request
     * whose prefix cache hit left a few dozen does not wait behind the
     * long prompts admitted before it), except that a prompt whose first
     * token has waited this long since its submission goes before them
     * all, in admission order, so a long prompt is not starved by a
     * stream of short ones (10000; 0: admission order). */
    int prompt_max_wait_ms;
    /* Reuse the KV of cached prompt prefixes (model.h's prefix cache; true).
     * A model with sliding-window layers runs without, and says so on
     * stderr at start. */
    bool prefix_cache;
    /* Grammar masks computed on a thread of their own while the forward
     * pass runs: -1 where the model runs off the CPU (the default), 1
     * always (tests), 0 never. */
    int overlap_masks;
} rt_sched_opts;

void rt_sched_opts_default(rt_sched_opts *o);

typedef enum rt_priority {
    RT_PRIO_INTERACTIVE = 0, /* admitted first */
    RT_PRIO_BATCH = 1,
} rt_priority;

typedef enum rt_sched_ev_kind {
    RT_EV_TEXT,  /* new text (valid UTF-8, stop strings held back) for one token */
    RT_EV_DONE,  /* final: finish_reason "stop" or "length" */
    RT_EV_ERROR, /* final: error says why */
} rt_sched_ev_kind;

typedef struct rt_sched_event {
    rt_sched_ev_kind kind;
    uint64_t id;
    const char *text; /* RT_EV_TEXT (may be empty while a stop string is pending) and DONE (the tail released
                         at the end) */
    size_t text_len;
    int32_t token; /* RT_EV_TEXT, and DONE after a token: the token generated */
    /* with the token, when the request asked for log-probabilities (else NULL) */
    const rt_token_logprobs *logprobs;
    const char *finish_reason; /* RT_EV_DONE */
    int prompt_tokens, completion_tokens;
    /* With log-probabilities: how many of the generated tokens, from the
     * first, may have theirs sent now. On TEXT, those whose text has begun
     * to go out: a token wholly in the held-back tail may yet prove part of
     * a stop string. On DONE, all but the last tokens lying wholly within
     * the stop string that matched: they count as generated, but their
     * text is not in the answer, so neither are their log-probabilities. */
    int lp_ready;
    /* Of prompt_tokens, those whose KV came from the prefix cache (in the
     * admission that computed the prompt). */
    int cached_tokens;
    int error; /* RT_EV_ERROR: -ETIMEDOUT deadline passed before the first token, -ECANCELED, -ENOMEM,
                * -ENOTRECOVERABLE (the device is lost), -EIO */
} rt_sched_event;

typedef void (*rt_sched_cb)(void *user, const rt_sched_event *ev);

typedef struct rt_sched_req {
    const int32_t *prompt; /* copied */
    int n_prompt;
    int max_tokens; /* new tokens; <= 0: up to the context length or the KV pool's size */
    rt_sampler_params sampling;
    const char *const *stops; /* copied; at most 16 */
    int n_stops;
    bool ignore_eos;
    bool logprobs;    /* report each token's log-probability... */
    int top_logprobs; /* ...and this many of the likeliest (0..20) */
    rt_priority priority;
    int64_t deadline_ms; /* absolute, epoch milliseconds; 0: none */
    /* When not NULL: receives the n_vocab logits the first token is drawn
     * from (the last prompt position's, before the sampler), on the compute
     * thread before that token's event. The numerics hook of `infergate
     * generate --dump-logits`. */
    float *first_logits;
    /* When not NULL: sampling is constrained to the grammar's language
     * (runtime/grammar); the answer ends ("stop") where the grammar is
     * complete. The scheduler takes its own reference. */
    rt_grammar *grammar;
    /* Token replay (a request resumed after the worker serving it failed):
     * the tokens it had generated, copied. They are computed with the
     * prompt and count as generated (max_tokens, completion_tokens), the
     * sampler and the stop strings are put where an unbroken run would have
     * them, the grammar's matcher moved past them, and their text, which
     * the client has had, is not sent again. -EINVAL where they had ended
     * the answer, -EILSEQ for one the grammar refuses, -ENOTSUP with
     * logprobs when the stop strings held back the text of some of them
     * (their log-probabilities went with the failed run). */
    const int32_t *resume;
    int n_resume;
    /* When not NULL: called with each resumed token's text as the stop
     * strings let it out ("" where they hold it back), as an unbroken run's
     * events carried it, on the submitting thread within rt_sched_submit:
     * the caller's parsers of the answer (tool calls, reasoning) are
     * brought to where they were. Nonzero (-ENOMEM) fails the submission
     * with that code. */
    int (*resumed_text)(void *ud, const char *text, size_t len);
    void *resumed_ud;
    /* The tenant it is served for (copied; NULL or "": the nameless one;
     * at most RT_SCHED_TENANT_MAX bytes), and its weight (RT_SCHED_WEIGHT_MIN
     * to _MAX; 0: 1; else -EINVAL). The last request's weight is the
     * tenant's. */
    const char *tenant;
    double weight;
    rt_sched_cb cb;
    void *user;
} rt_sched_req;

#define RT_SCHED_TENANT_MAX 64
#define RT_SCHED_WEIGHT_MIN 1e-3
#define RT_SCHED_WEIGHT_MAX 1e6

/* Starts the compute thread. NULL with err filled on failure. */
rt_sched *rt_sched_new(rt_model *m, const rt_sched_opts *o, char *err, size_t err_len);
/* Stops the thread; requests still open get ERROR -ECANCELED first. */
void rt_sched_free(rt_sched *s);

/* 0 and *id; -EAGAIN the queue of the request's priority is full (and
 * its tenant may push none out); -E2BIG
 * prompt plus max_tokens beyond the context length; -ENOSPC the prompt
 * (plus max_tokens) could never fit the KV pool; -EINVAL empty prompt,
 * bad token, tenant name or weight, or sampling parameters (rt_sampler_params_ok); -ENOMEM; -ESHUTDOWN. On failure no event will
 * come. */
int rt_sched_submit(rt_sched *s, const rt_sched_req *r, uint64_t *id);
/* deadline_ms is epoch milliseconds (gw_epoch_ms, gateway/base/clock.h): a
 * request is dropped once it reads past its deadline before its first
 * token, whether it is waiting, prefilling its prompt, or preempted while
 * it was. */
/* How many more requests of priority p rt_sched_submit would take now
 * (slots free plus room in p's queue) from any tenant; 0 when the queue is
 * full. */
int rt_sched_room(rt_sched *s, rt_priority p);
/* Whether a request of tenant (and weight, as rt_sched_req's) would, p's
 * queue being full, take the place of another tenant's (above). */
bool rt_sched_may_push_out(rt_sched *s, rt_priority p, const char *tenant, double weight);
/* Asks the request to stop at the next step; its KV blocks go back and its
 * final event is ERROR -ECANCELED (unless it finished first). Unknown ids
 * are ignored. */
void rt_sched_cancel(rt_sched *s, uint64_t id);
/* Holds the request out of the batches from the next step on (hold), its
 * KV blocks and sampler kept, or lets it go on (!hold): a reader that
 * cannot keep up pauses its sequence instead of losing its stream. A held
 * request may still be preempted for room, and a waiting one admitted
 * (held). Unknown ids are ignored. 0, or -ENOMEM (nothing changes). */
int rt_sched_hold(rt_sched *s, uint64_t id, bool hold);

typedef struct rt_sched_stats {
    int queued, running;
    int queued_batch; /* of queued, the batch-priority ones */
    int kv_blocks_free, kv_blocks_total, kv_block_tokens;
    kn_type kv_type;
    int max_seqs, max_queue, max_batch_tokens;
    double ttft_ewma_ms;    /* submit to first token: what clients feel, queueing included */
    double prefill_ewma_ms; /* admission to first token: the service time, for routing estimates */
    double tpot_ewma_ms; /* time per output token after the first */
    double tokens_per_s; /* generated tokens per second over the last few seconds */
    uint64_t requests_done, tokens_generated, preemptions;
    uint64_t pushed_out;  /* requests that gave their place in a full queue to another tenant's */
    uint64_t done_tokens; /* tokens generated by the requests_done (not by cancelled ones) */
    uint64_t requests_cancelled; /* dropped, waiting or running, because their client (the gateway) left */
    /* What routing ranks this worker by (runtime/sched_est.h): the time to
     * first token an interactive request of est_prompt_tokens (the recent
     * prompts' average, less what the prefix cache gave them) joining now
     * should expect, from a replay of the queue (prompt_tokens_ahead still
     * to prefill before it, a waiting prompt's cached prefix not counted; the tokens the
     * running requests have still to go) at the step times measured here:
     * step_base_ms + step_token_ms per token in the step. 0 before the first
     * step. Refreshed at most every few tens of ms. */
    double est_ttft_ms;
    int prompt_tokens_ahead;
    int est_prompt_tokens;
    double step_base_ms, step_token_ms;
    /* Prompt tokens a second in a step of a whole prefill budget, as
     * measured at that size (rt_step_fit_ms): what routing weighs a
     * prompt's prefill by. Not 1/step_token_ms: a line's slope fitted
     * over steps of every size moved 2x between two workers of one model
     * on one CPU, and sessions with it (test_worker_affinity). 0 before
     * the first step. */
    double prefill_tokens_per_s;
    /* Prefix cache. Tokens admitted sequences had to compute before their
     * next token (prompts, and what a preempted one recomputes) and those
     * they took from the cache instead; the blocks cached, and of them
     * those no sequence holds (evictable, counted in kv_blocks_free). */
    bool prefix_cache;
    uint64_t prompt_tokens_computed, prompt_tokens_cached;
    int kv_blocks_cached, kv_blocks_evictable;
} rt_sched_stats;

void rt_sched_get_stats(rt_sched *s, rt_sched_stats *st);

/* A tenant's share of the worker, as rt_sched_tenants reports it. */
typedef struct rt_sched_tenant_stats {
    char name[RT_SCHED_TENANT_MAX + 1]; /* "": the nameless tenant */
    double weight;                      /* its last request's */
    int running, queued;                /* slots it holds; its requests waiting (as of the last step) */
    /* since the worker started (or the tenant's figures were last recycled, below) */
    uint64_t tokens;     /* what fair share charged it: positions computed for it, prompt and generated
                            (a recompute after a preemption is not charged again) */
    uint64_t preempted;  /* its requests that gave their slot to another tenant's (fair share) */
    uint64_t pushed_out; /* its requests that gave their place in the queue to another tenant's */
    int folded;          /* RT_SCHED_TENANT_OTHER's: the tenants whose figures it holds now; else 0 */
} rt_sched_tenant_stats;

/* Tenants whose figures are kept, at most: past it, the figures of the
 * one idle longest (nothing running or queued) make room for a newcomer's,
 * and a newcomer finding none idle has its figures counted in one entry
 * more, named RT_SCHED_TENANT_OTHER (no tenant name the gateway takes),
 * until one is: reported once it was ever used, last, with `folded`. Fair
 * share itself knows every tenant, however many. */
#define RT_SCHED_TENANT_FIGS 64
#define RT_SCHED_TENANT_OTHER "(other)"
#define RT_SCHED_TENANT_REPORTS (RT_SCHED_TENANT_FIGS + 1) /* rt_sched_tenants' entries, at most */
/* The tenants seen, into out (max entries): returns how many, refreshed at
 * every step. */
int rt_sched_tenants(rt_sched *s, rt_sched_tenant_stats *out, int max);

#endif
