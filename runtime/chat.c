/* Chat templates: recognise a model's Jinja template by marker substrings
 * and render OpenAI messages the way that template would (see chat.h).
 *
 * Each renderer reproduces its family's published template byte for byte,
 * including the whitespace handling of the Jinja source (Llama-2 strips each
 * turn, Llama-3 trims each content, ChatML and Mistral keep content as is),
 * and rejects the role orders the template would raise an exception for. */
#include "runtime/chat.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- detection ---- */

static bool contains(const char *hay, size_t len, const char *needle)
{
    size_t n = strlen(needle);
    if (n > len)
        return false;
    for (size_t i = 0; i + n <= len; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, n) == 0)
            return true;
    return false;
}

static bool equals(const char *s, size_t len, const char *name)
{
    return strlen(name) == len && memcmp(s, name, len) == 0;
}

/* llama.cpp's names for the same families, so a config written for one
 * works for the other. */
static const char *const k_names[RT_CHAT_N_KINDS] = {
    [RT_CHAT_CHATML] = "chatml",         [RT_CHAT_LLAMA2] = "llama2",
    [RT_CHAT_LLAMA3] = "llama3",         [RT_CHAT_MISTRAL] = "mistral",
    [RT_CHAT_ZEPHYR] = "zephyr",         [RT_CHAT_MISTRAL_V1] = "mistral-v1",
    [RT_CHAT_MISTRAL_V3] = "mistral-v3", [RT_CHAT_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [RT_CHAT_MISTRAL_V7] = "mistral-v7", [RT_CHAT_MISTRAL_V7_TEKKEN] = "mistral-v7-tekken",
    [RT_CHAT_LLAMA31] = "llama3.1",      [RT_CHAT_LLAMA32] = "llama3.2",
    [RT_CHAT_QWEN3] = "qwen3",           [RT_CHAT_QWEN3_THINKING] = "qwen3-thinking",
};

rt_chat_kind rt_chat_detect(const char *tmpl, size_t len, bool *recognised)
{
    bool dummy;
    if (!recognised)
        recognised = &dummy;
    /* No template at all is the documented default, not a surprise worth
     * reporting: only an unrecognised template clears `recognised`. */
    *recognised = true;
    if (!tmpl || len == 0)
        return RT_CHAT_CHATML;
    /* A template that is a bare family name is that family. */
    for (int k = 0; k < RT_CHAT_N_KINDS; k++)
        if (equals(tmpl, len, k_names[k]))
            return (rt_chat_kind)k;
    /* Order matters: a template may mention several markers (e.g. a Llama-3
     * template explaining ChatML in a comment), so the most specific first. */
    /* Llama 3.1 and later always open with a system turn that dates the
     * conversation: 3.2's by the day it is rendered (strftime_now, which
     * Hugging Face and llama.cpp define), 3.1's and 3.3's by a fixed day. */
    if (contains(tmpl, len, "<|start_header_id|>"))
        return !contains(tmpl, len, "Cutting Knowledge Date") ? RT_CHAT_LLAMA3
               : contains(tmpl, len, "strftime_now")          ? RT_CHAT_LLAMA32
                                                              : RT_CHAT_LLAMA31;
    /* Qwen3's ChatML reads the reasoning out of assistant turns (QwQ's
     * template strips it too, but names no reasoning_content); its
     * thinking-only models open the answer with <think> themselves */
    if (contains(tmpl, len, "<|im_start|>")) {
        if (!contains(tmpl, len, "reasoning_content") || !contains(tmpl, len, "</think>"))
            return RT_CHAT_CHATML;
        return contains(tmpl, len, "assistant\\n<think>\\n'") ? RT_CHAT_QWEN3_THINKING : RT_CHAT_QWEN3;
    }
    /* Phi-3 (<|end|>) and StableLM's Zephyr (<|endoftext|>) share the role
     * tags but end turns otherwise: not ours to render with </s>. */
    if (contains(tmpl, len, "<|user|>") && contains(tmpl, len, "<|assistant|>") &&
        !contains(tmpl, len, "<|end|>") && !contains(tmpl, len, "<|endoftext|>"))
        return RT_CHAT_ZEPHYR;
    /* Mistral's templates by their revision's marks, as llama.cpp tells
     * them apart: v7 has a system prompt of its own, v0.3 offers tools,
     * v0.2's later one puts a space before [INST]; the Tekken vocabularies'
     * templates write the control tokens with no space after them. Small
     * 3.1's template offers tools too, so v7 first. */
    if (contains(tmpl, len, "[SYSTEM_PROMPT]"))
        return contains(tmpl, len, "'[INST] '") || contains(tmpl, len, "\"[INST] \"")
                   ? RT_CHAT_MISTRAL_V7
                   : RT_CHAT_MISTRAL_V7_TEKKEN;
    if (contains(tmpl, len, "[AVAILABLE_TOOLS]"))
        return contains(tmpl, len, "\"[INST]\"") || contains(tmpl, len, "'[INST]'")
                   ? RT_CHAT_MISTRAL_V3_TEKKEN
                   : RT_CHAT_MISTRAL_V3;
    if (contains(tmpl, len, "' [INST] '"))
        return RT_CHAT_MISTRAL_V1;
    if (contains(tmpl, len, "[INST]"))
        return contains(tmpl, len, "<<SYS>>") ? RT_CHAT_LLAMA2 : RT_CHAT_MISTRAL;
    *recognised = false;
    return RT_CHAT_CHATML;
}

const char *rt_chat_kind_name(rt_chat_kind k)
{
    return k >= 0 && k < RT_CHAT_N_KINDS ? k_names[k] : "unknown";
}

int rt_chat_kind_from_name(const char *name)
{
    for (int k = 0; k < RT_CHAT_N_KINDS; k++)
        if (!strcmp(name, k_names[k]))
            return k;
    return -1;
}

const char *rt_chat_turn_end(rt_chat_kind k)
{
    switch (k) {
    case RT_CHAT_CHATML:
    case RT_CHAT_QWEN3:
    case RT_CHAT_QWEN3_THINKING:
        return "<|im_end|>";
    case RT_CHAT_LLAMA3:
    case RT_CHAT_LLAMA31:
    case RT_CHAT_LLAMA32:
        return "<|eot_id|>";
    default:
        return "</s>";
    }
}

/* ---- output buffer ---- */

typedef struct buf {
    char *p;
    size_t len, cap;
    rt_text_span *spans; /* where message content went, when want_spans */
    int n_spans, cap_spans;
    bool want_spans, oom;
} buf;

static void buf_add(buf *b, const char *s, size_t n)
{
    if (b->oom || n == 0)
        return;
    if (n > SIZE_MAX - b->len - 1) {
        b->oom = true;
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap = cap > SIZE_MAX / 2 ? b->len + n + 1 : cap * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void buf_str(buf *b, const char *s)
{
    if (s)
        buf_add(b, s, strlen(s));
}

/* Appends text taken from a message, and records where it went. */
static void buf_content(buf *b, const char *s, size_t n)
{
    size_t at = b->len;
    buf_add(b, s, n);
    if (b->oom || !b->want_spans || b->len == at)
        return;
    rt_text_span *last = b->n_spans ? &b->spans[b->n_spans - 1] : NULL;
    if (last && last->off + last->len == at) {
        last->len += b->len - at;
        return;
    }
    if (b->n_spans == b->cap_spans) {
        int cap = b->cap_spans ? 2 * b->cap_spans : 8;
        rt_text_span *p = b->cap_spans < INT_MAX / 2 ? realloc(b->spans, (size_t)cap * sizeof(*p)) : NULL;
        if (!p) {
            b->oom = true;
            return;
        }
        b->spans = p;
        b->cap_spans = cap;
    }
    b->spans[b->n_spans++] = (rt_text_span){at, b->len - at};
}

/* Python's str.strip() as Jinja's |trim and .strip() apply it, limited to
 * ASCII whitespace (the Unicode spaces it also strips do not occur at the
 * edges of real chat turns often enough to be worth a UTF-8 decoder). */
static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static void buf_add_stripped(buf *b, const char *s, size_t n)
{
    while (n > 0 && is_space(s[0])) {
        s++;
        n--;
    }
    while (n > 0 && is_space(s[n - 1]))
        n--;
    buf_content(b, s, n);
}

/* ---- rendering ---- */

enum role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_OTHER };

static enum role role_of(const char *r)
{
    if (!r)
        return ROLE_OTHER;
    if (strcmp(r, "system") == 0)
        return ROLE_SYSTEM;
    if (strcmp(r, "user") == 0)
        return ROLE_USER;
    if (strcmp(r, "assistant") == 0)
        return ROLE_ASSISTANT;
    return ROLE_OTHER;
}

static int fail(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t err_len, const char *fmt, ...)
{
    if (err && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

static const char *content_of(const rt_chat_msg *m)
{
    return m->content ? m->content : "";
}

/* Appends a message's content as it is. */
static void buf_message(buf *b, const rt_chat_msg *m)
{
    const char *c = content_of(m);
    buf_content(b, c, strlen(c));
}

/* Families that write every message as open + role + mid + content + close,
 * then the assistant's opening:
 *  ChatML: <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
 *   (the generic template; Qwen2's adds a default system prompt when none
 *   is given, which is the client's to send);
 *  Zephyr (HuggingFaceH4/zephyr-7b-beta, TinyLlama-1.1B-Chat): bos, then
 *   <|{role}|>\n{content}</s>\n (Jinja's trim_blocks keeps the newline after
 *   each expression) ... <|assistant|>\n. Its template writes no BOS, the
 *   tokenizer adds it (add_bos_token): it is written here, as the caller
 *   encodes without adding one. Its eos_token is </s> in both vocabularies. */
static void render_turns(buf *b, const rt_chat_msg *msgs, int n, const char *open, const char *mid,
                         const char *close, const char *assistant)
{
    for (int i = 0; i < n; i++) {
        buf_str(b, open);
        buf_str(b, msgs[i].role);
        buf_str(b, mid);
        buf_message(b, &msgs[i]);
        buf_str(b, close);
    }
    buf_str(b, assistant);
}

/* The last occurrence of needle in s[0, n), or NULL. */
static const char *find_last(const char *s, size_t n, const char *needle)
{
    const size_t k = strlen(needle);
    for (size_t i = n; i >= k; i--)
        if (memcmp(s + i - k, needle, k) == 0)
            return s + i - k;
    return NULL;
}

static void trim_newlines(const char **s, size_t *n, bool front, bool back)
{
    while (front && *n > 0 && **s == '\n') {
        (*s)++;
        (*n)--;
    }
    while (back && *n > 0 && (*s)[*n - 1] == '\n')
        (*n)--;
}

/* Qwen3 (the ChatML turns, no tools): an assistant message's content is
 * read as reasoning and answer when it has a </think>: the answer is what
 * follows the last one, its leading newlines dropped; the reasoning is
 * what precedes the first one, after the last <think> there, newlines
 * trimmed off both ends. Turns before the last user message keep only
 * their answer, as the model was trained on; a turn after it (the
 * conversation's last, continued) keeps its reasoning in a think block, as
 * does any with reasoning. The answer opens with `answer`: the
 * assistant's turn, with an empty think block when thinking is off
 * (enable_thinking false), or an open one for the thinking-only models. */
static void render_qwen3(buf *b, const rt_chat_msg *msgs, int n, const char *answer)
{
    int last_query = n - 1; /* the last user message that is no tool's answer */
    for (int i = n - 1; i >= 0; i--) {
        const char *c = content_of(&msgs[i]);
        const size_t len = strlen(c), tr = strlen("</tool_response>");
        if (role_of(msgs[i].role) == ROLE_USER &&
            !(strncmp(c, "<tool_response>", strlen("<tool_response>")) == 0 && len >= tr &&
              strcmp(c + len - tr, "</tool_response>") == 0)) {
            last_query = i;
            break;
        }
    }
    for (int i = 0; i < n; i++) {
        const char *c = content_of(&msgs[i]);
        size_t len = strlen(c);
        buf_str(b, "<|im_start|>");
        buf_str(b, msgs[i].role);
        buf_str(b, "\n");
        if (role_of(msgs[i].role) != ROLE_ASSISTANT) {
            buf_content(b, c, len);
            buf_str(b, "<|im_end|>\n");
            continue;
        }
        const char *r = "", *end = strstr(c, "</think>");
        size_t r_len = 0;
        if (end) {
            const char *open = find_last(c, (size_t)(end - c), "<think>");
            r = open ? open + strlen("<think>") : c;
            r_len = (size_t)(end - r);
            trim_newlines(&r, &r_len, true, true);
            const char *last = find_last(c, len, "</think>") + strlen("</think>");
            len -= (size_t)(last - c);
            c = last;
            trim_newlines(&c, &len, true, false);
        }
        if (i > last_query && (i == n - 1 || r_len > 0)) {
            buf_str(b, "<think>\n");
            buf_content(b, r, r_len);
            buf_str(b, "\n</think>\n\n");
            trim_newlines(&c, &len, true, false);
        }
        buf_content(b, c, len);
        buf_str(b, "<|im_end|>\n");
    }
    buf_str(b, answer);
}

/* Meta-Llama-3-Instruct: bos, then per message
 * <|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>.
 * Llama 3.1's (with a date): a system turn first, always, that says
 * "Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n" and then
 * the first message's content if it is a system message (trimmed); the
 * rest as Llama-3 (tool roles aside, which the parser refuses). */
#define LLAMA31_DATE "26 Jul 2024" /* the templates' own, where none is given */

static void render_llama3(buf *b, const rt_chat_msg *msgs, int n, const char *bos, const char *date)
{
    buf_str(b, bos);
    int start = 0;
    if (date) {
        buf_str(b, "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                   "Today Date: ");
        buf_str(b, date);
        buf_str(b, "\n\n");
        if (role_of(msgs[0].role) == ROLE_SYSTEM) {
            const char *c = content_of(&msgs[0]);
            buf_add_stripped(b, c, strlen(c));
            start = 1;
        }
        buf_str(b, "<|eot_id|>");
    }
    for (int i = start; i < n; i++) {
        const char *c = content_of(&msgs[i]);
        buf_str(b, "<|start_header_id|>");
        buf_str(b, msgs[i].role);
        buf_str(b, "<|end_header_id|>\n\n");
        buf_add_stripped(b, c, strlen(c));
        buf_str(b, "<|eot_id|>");
    }
    buf_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Llama-2 and Mistral share the template's rule: an optional leading system
 * message, then user and assistant strictly alternating from a user turn. */
static int check_alternation(const char *family, const rt_chat_msg *msgs, int n, int start, char *err,
                             size_t err_len)
{
    if (start >= n)
        return fail(err, err_len, "%s: the conversation needs a user message after the system message",
                    family);
    for (int i = start; i < n; i++) {
        enum role want = (i - start) % 2 == 0 ? ROLE_USER : ROLE_ASSISTANT;
        if (role_of(msgs[i].role) != want)
            return fail(err, err_len,
                        "%s: roles must alternate user/assistant/user/... after an optional leading "
                        "system message (messages[%d] is '%s', expected '%s')",
                        family, i, msgs[i].role ? msgs[i].role : "(null)",
                        want == ROLE_USER ? "user" : "assistant");
    }
    return 0;
}

/* Llama-2-chat: per user turn bos + "[INST] " + strip(content) + " [/INST]",
 * the system block folded into the first user turn before the strip, per
 * assistant turn " " + strip(content) + " </s>". */
static int render_llama2(buf *b, const rt_chat_msg *msgs, int n, const char *bos, char *err, size_t err_len)
{
    int start = role_of(msgs[0].role) == ROLE_SYSTEM ? 1 : 0;
    int rc = check_alternation("llama2", msgs, n, start, err, err_len);
    if (rc < 0)
        return rc;
    for (int i = start; i < n; i++) {
        const char *c = content_of(&msgs[i]);
        if (role_of(msgs[i].role) == ROLE_ASSISTANT) {
            buf_str(b, " ");
            buf_add_stripped(b, c, strlen(c));
            buf_str(b, " </s>");
            continue;
        }
        buf_str(b, bos);
        buf_str(b, "[INST] ");
        if (i == start && start == 1) {
            /* The template strips the whole turn, system block included, so
             * the block's leading text is kept and only the ends move. The
             * whole turn counts as content: <<SYS>> is plain text in
             * Llama-2's vocabulary. */
            buf turn = {0};
            buf_str(&turn, "<<SYS>>\n");
            buf_str(&turn, content_of(&msgs[0]));
            buf_str(&turn, "\n<</SYS>>\n\n");
            buf_str(&turn, c);
            if (turn.oom)
                b->oom = true;
            else
                buf_add_stripped(b, turn.p, turn.len);
            free(turn.p);
        } else {
            buf_add_stripped(b, c, strlen(c));
        }
        buf_str(b, " [/INST]");
    }
    return 0;
}

/* Mistral-Instruct's revisions, bos once, then:
 *  v0.1 (and v0.2's first template): "[INST] " + content + " [/INST]" per
 *   user turn (a system message prepended to the first one, then "\n\n"),
 *   content + "</s>" per assistant turn;
 *  v0.2's later template (v1): " [INST] " + content + " [/INST]", the
 *   system message in the first user turn, " " + content + "</s>";
 *  v0.3 (v3): "[INST] " + content + "[/INST]" ([INST] and [/INST] are
 *   control tokens there), the system message in the last user turn (and
 *   nowhere when the conversation ends on an assistant turn),
 *   " " + trim(content) + "</s>";
 *  Nemo (v3-tekken): as v0.3 with no space after [INST] nor before the
 *   answer, and the answer as it is. */
static int render_mistral(buf *b, rt_chat_kind k, const rt_chat_msg *msgs, int n, const char *bos, char *err,
                          size_t err_len)
{
    int start = role_of(msgs[0].role) == ROLE_SYSTEM ? 1 : 0;
    int rc = check_alternation(rt_chat_kind_name(k), msgs, n, start, err, err_len);
    if (rc < 0)
        return rc;
    bool v3 = k == RT_CHAT_MISTRAL_V3 || k == RT_CHAT_MISTRAL_V3_TEKKEN;
    int sys_turn = start == 0 ? -1 : v3 ? n - 1 : start;
    buf_str(b, bos);
    for (int i = start; i < n; i++) {
        if (role_of(msgs[i].role) == ROLE_ASSISTANT) {
            if (k != RT_CHAT_MISTRAL && k != RT_CHAT_MISTRAL_V3_TEKKEN)
                buf_str(b, " ");
            if (k == RT_CHAT_MISTRAL_V3)
                buf_add_stripped(b, content_of(&msgs[i]), strlen(content_of(&msgs[i])));
            else
                buf_message(b, &msgs[i]);
            buf_str(b, "</s>");
            continue;
        }
        buf_str(b, k == RT_CHAT_MISTRAL_V1          ? " [INST] "
                   : k == RT_CHAT_MISTRAL_V3_TEKKEN ? "[INST]"
                                                    : "[INST] ");
        if (i == sys_turn) {
            buf_message(b, &msgs[0]);
            buf_str(b, "\n\n");
        }
        buf_message(b, &msgs[i]);
        buf_str(b, v3 ? "[/INST]" : " [/INST]");
    }
    return 0;
}

/* Mistral's v7 templates (Large-2411; Small 3 and 3.1 with the Tekken
 * vocabulary, no spaces): bos, then every message in order, any order of
 * roles: "[SYSTEM_PROMPT] " + content + "[/SYSTEM_PROMPT]",
 * "[INST] " + content + "[/INST]", " " + content + "</s>". Small 3's
 * template adds a default system prompt of its own (with today's date)
 * when none is given; as in llama.cpp's built-in, that is the client's to
 * send. */
static void render_mistral_v7(buf *b, rt_chat_kind k, const rt_chat_msg *msgs, int n, const char *bos)
{
    const char *sp = k == RT_CHAT_MISTRAL_V7 ? " " : "";
    buf_str(b, bos);
    for (int i = 0; i < n; i++) {
        enum role r = role_of(msgs[i].role); /* the caller has refused other roles */
        buf_str(b, r == ROLE_SYSTEM ? "[SYSTEM_PROMPT]" : r == ROLE_USER ? "[INST]" : "");
        buf_str(b, sp);
        buf_message(b, &msgs[i]);
        buf_str(b, r == ROLE_SYSTEM ? "[/SYSTEM_PROMPT]" : r == ROLE_USER ? "[/INST]" : "</s>");
    }
}

int rt_chat_render(rt_chat_kind k, const rt_chat_msg *msgs, int n, const char *bos, const rt_chat_opts *opts,
                   char **out, rt_text_span **content, int *n_content, char *err, size_t err_len)
{
    *out = NULL;
    if (content) {
        *content = NULL;
        *n_content = 0;
    }
    if (!msgs || n <= 0)
        return fail(err, err_len, "no messages to render");
    /* The role is written into the prompt by ChatML and Llama-3, so only the
     * three roles every family knows get through (no text injected as a
     * role header). */
    for (int i = 0; i < n; i++)
        if (role_of(msgs[i].role) == ROLE_OTHER)
            return fail(err, err_len, "messages[%d]: role '%.32s' is not supported (system, user, assistant)",
                        i, msgs[i].role ? msgs[i].role : "(null)");

    buf b = {.want_spans = content != NULL};
    int rc = 0;
    switch (k) {
    case RT_CHAT_CHATML:
        render_turns(&b, msgs, n, "<|im_start|>", "\n", "<|im_end|>\n", "<|im_start|>assistant\n");
        break;
    case RT_CHAT_LLAMA3:
        render_llama3(&b, msgs, n, bos, NULL);
        break;
    case RT_CHAT_LLAMA31:
        render_llama3(&b, msgs, n, bos, LLAMA31_DATE);
        break;
    case RT_CHAT_LLAMA32: {
        /* strftime_now("%d %b %Y"): the local day, in English (this
         * process keeps the C locale) */
        char today[32] = LLAMA31_DATE;
        struct tm tm;
        time_t t = time(NULL);
        if (localtime_r(&t, &tm))
            strftime(today, sizeof(today), "%d %b %Y", &tm);
        render_llama3(&b, msgs, n, bos, today);
        break;
    }
    case RT_CHAT_LLAMA2:
        rc = render_llama2(&b, msgs, n, bos, err, err_len);
        break;
    case RT_CHAT_MISTRAL:
    case RT_CHAT_MISTRAL_V1:
    case RT_CHAT_MISTRAL_V3:
    case RT_CHAT_MISTRAL_V3_TEKKEN:
        rc = render_mistral(&b, k, msgs, n, bos, err, err_len);
        break;
    case RT_CHAT_MISTRAL_V7:
    case RT_CHAT_MISTRAL_V7_TEKKEN:
        render_mistral_v7(&b, k, msgs, n, bos);
        break;
    case RT_CHAT_QWEN3:
    case RT_CHAT_QWEN3_THINKING:
        render_qwen3(&b, msgs, n,
                     k == RT_CHAT_QWEN3_THINKING ? "<|im_start|>assistant\n<think>\n"
                     : opts && opts->no_thinking ? "<|im_start|>assistant\n<think>\n\n</think>\n\n"
                                                 : "<|im_start|>assistant\n");
        break;
    case RT_CHAT_ZEPHYR:
        buf_str(&b, bos);
        render_turns(&b, msgs, n, "<|", "|>\n", "</s>\n", "<|assistant|>\n");
        break;
    default:
        rc = fail(err, err_len, "unknown chat template kind %d", (int)k);
        break;
    }
    if (rc < 0)
        goto fail_buf;
    if (b.oom) {
        rc = -ENOMEM;
        fail(err, err_len, "out of memory rendering the chat template");
        goto fail_buf;
    }
    if (!b.p) {
        /* Every family writes at least the assistant opening; still, never
         * hand back NULL with success. */
        b.p = calloc(1, 1);
        if (!b.p) {
            fail(err, err_len, "out of memory rendering the chat template");
            rc = -ENOMEM;
            goto fail_buf;
        }
    }
    *out = b.p;
    if (content) {
        *content = b.spans;
        *n_content = b.n_spans;
    }
    return 0;

fail_buf:
    free(b.p);
    free(b.spans);
    return rc;
}
