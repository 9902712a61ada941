/* Jinja templates: the subset of Jinja2 that published chat templates use,
 * rendered as Hugging Face's apply_chat_template renders them (Jinja2's
 * ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the
 * loop controls; `tojson` as json.dumps without HTML escaping or key
 * sorting; the globals raise_exception and strftime_now).
 *
 * What is in: text with whitespace control ({%- -%}, {%+ +%}, trim_blocks,
 * lstrip_blocks), comments, raw blocks; if/elif/else, for (unpacking, an
 * `if` filter, else, loop.*, break/continue), set (names, tuples,
 * namespace attributes, set blocks), macros (defaults, keyword arguments,
 * recursion), the generation block Hugging Face's templates mark the
 * answer with; expressions with Python's values and operators (int, float,
 * str, list, tuple, dict, None, Jinja's undefined), slices, attribute and
 * item access with Jinja's fall-backs, the common filters, tests, string
 * and dict methods. Anything else is refused by name when the template is
 * parsed (a tag, a filter, a test) or when it runs (a method, an operand
 * type), never ignored.
 *
 * A template is parsed once and may be rendered any number of times, from
 * any number of threads at once: rendering reads it and writes only its
 * own arena. Every render is bounded: output bytes, memory, evaluation
 * steps (loops included), nesting depth; a render that passes a bound
 * fails with an error saying which, and nothing a template or its input
 * does can crash the process.
 *
 * Content spans: every string taken from the `plain` input (a client's
 * messages, tools, kwargs) carries the knowledge of where it came from
 * through concatenation, slicing and stripping; a string made from such a
 * string in another way (tojson, replace, upper) is plain as a whole. The
 * output says which byte ranges are plain, so the caller can encode them
 * without matching control tokens in them (rt_tokenizer_encode_spans): a
 * message cannot forge a role header, whatever the template does with it. */
#ifndef RT_JINJA_H
#define RT_JINJA_H

#include "runtime/tokenizer.h" /* rt_text_span */

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef struct rt_jinja rt_jinja;

/* The largest template source accepted (the largest published chat
 * templates are some 50 KB). */
#define RT_JINJA_MAX_SOURCE (1u << 20)

/* Parses a template. 0, or -EINVAL with err "template line N: why" (a
 * syntax error, a tag or filter or test we do not have, nesting too deep,
 * a source over RT_JINJA_MAX_SOURCE or not UTF-8), -ENOMEM. */
int rt_jinja_parse(const char *src, size_t len, rt_jinja **out, char *err, size_t err_len);
void rt_jinja_free(rt_jinja *t);

/* Whether the template's source mentions a name (a variable, an attribute
 * or a filter), for callers that choose a template by what it reads. */
bool rt_jinja_uses(const rt_jinja *t, const char *name);

typedef struct rt_jinja_limits {
    size_t max_output;  /* bytes of output; 0: 64 MiB */
    size_t max_memory;  /* bytes of the render's arena; 0: 256 MiB */
    uint64_t max_steps; /* expressions and statements evaluated; 0: 50 million */
    int max_depth;      /* macro calls and nested evaluation; 0: 400 */
} rt_jinja_limits;

typedef struct rt_jinja_input {
    /* The variables, from two JSON objects (either may be NULL): `plain`'s
     * strings are marked plain in the output (see above), `trusted`'s are
     * not (bos_token, add_generation_prompt). A name in both is trusted's. */
    const json_t *plain;
    const json_t *trusted;
    /* The time strftime_now formats (local time); 0: now. */
    time_t now;
    rt_jinja_limits limits;
} rt_jinja_input;

typedef struct rt_jinja_output {
    char *text; /* malloc'd, NUL-terminated */
    size_t len;
    rt_text_span *plain; /* malloc'd (NULL when none), sorted, not overlapping */
    int n_plain;
} rt_jinja_output;

/* Renders t. 0 with *out filled (free with rt_jinja_output_dispose); or
 * with err filled and *out empty: -EINVAL the template failed (its own
 * raise_exception, whose message err carries as it is, or an error of
 * evaluation: "template line N: why"), -E2BIG a bound was passed (err says
 * which), -ENOMEM. */
int rt_jinja_render(const rt_jinja *t, const rt_jinja_input *in, rt_jinja_output *out, char *err,
                    size_t err_len);
void rt_jinja_output_dispose(rt_jinja_output *out);

#endif
