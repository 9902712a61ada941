/* `infergate model gen`, `infergate model inspect` and `infergate model
 * quantize`. */
#include "gateway/cmd/cli.h"
#include "gateway/base/num.h"

#include "kernels/kn.h"
#include "runtime/gguf.h"
#include "runtime/model.h"
#include "runtime/model_gen.h"
#include "runtime/quantize.h"
#include "runtime/tokenizer.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void gen_usage(FILE *f)
{
    rt_gen_params d;
    rt_gen_params_default(&d);
    fprintf(f,
            "usage: infergate model gen --out FILE [options]\n"
            "Writes a llama-family GGUF with random weights and a byte-level SentencePiece\n"
            "vocabulary, for tests and benchmarks. Same seed and shape: same weights in every type.\n"
            "  --dim N        embedding length (default %d)\n"
            "  --layers N     blocks (default %d)\n"
            "  --heads N      attention heads (default %d)\n"
            "  --kv-heads N   key/value heads, GQA when fewer than heads (default %d)\n"
            "  --ffn N        feed-forward length (default %d)\n"
            "  --vocab N      vocabulary size, at least 259 (default %d)\n"
            "  --ctx N        context length (default %d)\n"
            "  --type T       the weights' type, a name of llama.cpp's quantize tool: Q4_K_M, Q8_0,\n"
            "                 F16 ... (`model quantize --help` lists them; default %s), its mixture\n"
            "                 of types as `model quantize` writes it\n"
            "  --pure         T's type for every matrix, not its mixture\n"
            "  --arch NAME    the architecture's tensors and keys: %s (default llama)\n"
            "  --experts N    experts per layer of an MoE architecture (mixtral, qwen3moe, gpt-oss,\n"
            "                 granitemoe: default 8; any other becomes MoE with N > 0)\n"
            "  --experts-used K  experts each token uses (default 2)\n"
            "  --swa N        sliding window of the families that have one (default: the family's)\n"
            "  --softcap A,F  attention and final logit soft-caps of the families that have them\n"
            "                 (gemma2; default: the family's 50,30)\n"
            "  --seed N       weight seed (default %llu)\n"
            "  --tied         no output.weight: the embeddings are reused as the output head\n"
            "  --chat-template STR   store a chat template in tokenizer.chat_template\n",
            d.dim, d.layers, d.heads, d.kv_heads, d.ffn, d.vocab, d.ctx,
            rt_ftype_name(rt_ftype_of_type(d.type)), rt_gen_arch_names(), (unsigned long long)d.seed);
}

/* Writes the model in file type ft: its base type throughout when that is
 * what the mixture gives (pure, or a float or Q8_0 file), else through an F32
 * file beside out that `model quantize`'s rules convert, so that a mixture
 * is the one a quantized download of the model would be. */
static int gen_file(rt_gen_params *p, rt_ftype ft, bool pure, const char *out, char *err, size_t err_len)
{
    p->type = rt_ftype_base_type(ft);
    if (pure || ft == RT_FTYPE_F32 || ft == RT_FTYPE_F16 || ft == RT_FTYPE_BF16 || ft == RT_FTYPE_Q8_0)
        return rt_model_gen(p, out, err, err_len);
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.f32.tmp", out) >= sizeof(tmp)) {
        snprintf(err, err_len, "path too long");
        return -EINVAL;
    }
    rt_gen_params f = *p;
    f.type = KN_TYPE_F32;
    int rc = rt_model_gen(&f, tmp, err, err_len);
    if (rc == 0) {
        rt_quant_opts qo = {.ftype = ft};
        rc = rt_quantize_file(tmp, out, &qo, NULL, err, err_len);
    }
    unlink(tmp);
    return rc;
}

static int cmd_gen(int argc, char **argv)
{
    rt_gen_params p;
    rt_gen_params_default(&p);
    const char *out = NULL;
    rt_ftype ft = (rt_ftype)rt_ftype_of_type(p.type);
    bool pure = false;
    /* the integer options first, in opts' order: their messages name opts[c - O_DIM + 1] */
    enum { O_DIM = 256, O_LAYERS, O_HEADS, O_KV, O_FFN, O_VOCAB, O_CTX, O_EXPERTS, O_USED, O_SWA, O_TYPE, O_SEED,
           O_TIED, O_CHAT, O_ARCH, O_PURE, O_SOFTCAP };
    static const struct option opts[] = {
        {"out", required_argument, 0, 'o'},     {"dim", required_argument, 0, O_DIM},
        {"layers", required_argument, 0, O_LAYERS}, {"heads", required_argument, 0, O_HEADS},
        {"kv-heads", required_argument, 0, O_KV}, {"ffn", required_argument, 0, O_FFN},
        {"vocab", required_argument, 0, O_VOCAB}, {"ctx", required_argument, 0, O_CTX},
        {"experts", required_argument, 0, O_EXPERTS}, {"experts-used", required_argument, 0, O_USED},
        {"swa", required_argument, 0, O_SWA},     {"arch", required_argument, 0, O_ARCH},
        {"type", required_argument, 0, O_TYPE},  {"seed", required_argument, 0, O_SEED},
        {"tied", no_argument, 0, O_TIED},        {"chat-template", required_argument, 0, O_CHAT},
        {"pure", no_argument, 0, O_PURE},        {"softcap", required_argument, 0, O_SOFTCAP},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    optind = 1;
    int c;
    long v;
    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        int *field = NULL;
        switch (c) {
        case 'o': out = optarg; continue;
        case O_DIM: field = &p.dim; break;
        case O_LAYERS: field = &p.layers; break;
        case O_HEADS: field = &p.heads; break;
        case O_KV: field = &p.kv_heads; break;
        case O_FFN: field = &p.ffn; break;
        case O_VOCAB: field = &p.vocab; break;
        case O_CTX: field = &p.ctx; break;
        case O_EXPERTS: field = &p.experts; break;
        case O_USED: field = &p.experts_used; break;
        case O_SWA: field = &p.swa; break;
        case O_ARCH: p.arch = optarg; continue;
        case O_TIED: p.tied = true; continue;
        case O_CHAT: p.chat_template = optarg; continue;
        case O_PURE: pure = true; continue;
        case O_SOFTCAP: {
            char tail;
            if (sscanf(optarg, "%f,%f%c", &p.attn_softcap, &p.final_softcap, &tail) != 2 ||
                !(p.attn_softcap > 0 && p.attn_softcap < 1e30f) ||
                !(p.final_softcap > 0 && p.final_softcap < 1e30f)) {
                fprintf(stderr, "model gen: --softcap must be two positive numbers A,F, not '%s'\n", optarg);
                return 2;
            }
            continue;
        }
        case O_TYPE:
            if (rt_ftype_from_name(optarg, &ft)) {
                fprintf(stderr, "model gen: --type must be one of %s, not '%s'\n", rt_ftype_names(), optarg);
                return 2;
            }
            p.type = rt_ftype_base_type(ft);
            continue;
        case O_SEED:
            if (gw_parse_u64(optarg, &p.seed)) {
                fprintf(stderr, "model gen: --seed must be a whole number from 0 to 2^64 - 1, not '%s'\n",
                        optarg);
                return 2;
            }
            continue;
        case 'h': gen_usage(stdout); return 0;
        default: gen_usage(stderr); return 2;
        }
        if (gw_parse_int(optarg, 1, 1 << 24, &v)) {
            fprintf(stderr, "model gen: --%s must be a whole number from 1 to %d, not '%s'\n",
                    opts[c - O_DIM + 1].name, 1 << 24, optarg);
            return 2;
        }
        *field = (int)v;
    }
    if (!out || optind != argc) {
        gen_usage(stderr);
        return 2;
    }
    char err[512];
    int rc = gen_file(&p, ft, pure, out, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "model gen: %s: %s\n", out, err);
        return 1;
    }
    printf("wrote %s: %s, dim %d, %d layers, %d heads (%d kv), ffn %d, vocab %d, ctx %d, %s%s, seed %llu\n",
           out, p.arch ? p.arch : "llama", p.dim, p.layers, p.heads, p.kv_heads, p.ffn, p.vocab, p.ctx,
           rt_ftype_name(ft), pure ? " (pure)" : "", (unsigned long long)p.seed);
    return 0;
}

static void human_bytes(uint64_t b, char *buf, size_t n)
{
    if (b >= 1ull << 30)
        snprintf(buf, n, "%.2f GiB", (double)b / (1 << 30));
    else if (b >= 1ull << 20)
        snprintf(buf, n, "%.2f MiB", (double)b / (1 << 20));
    else
        snprintf(buf, n, "%.1f KiB", (double)b / 1024);
}

/* Each type's tensor count and bits per weight, as llama.cpp's loader lists
 * them, and the whole file's. */
static void print_types(const rt_gguf *g)
{
    uint32_t count[KN_TYPE_COUNT] = {0};
    uint64_t bytes = 0, elems = 0;
    for (int64_t i = 0; i < rt_gguf_n_tensors(g); i++) {
        const rt_gguf_tensor *t = rt_gguf_tensor_at(g, i);
        count[t->type]++; /* the reader refuses a type it does not know */
        bytes += t->nbytes;
        elems += t->nbytes / kn_type_block_bytes(t->type) * (uint64_t)kn_type_block_elems(t->type);
    }
    printf("\ntypes:\n");
    for (uint32_t t = 0; t < KN_TYPE_COUNT; t++)
        if (count[t])
            printf("  %-7s %5u tensor%s  %6.3f bits per weight\n", kn_type_name(t), count[t],
                   count[t] == 1 ? " " : "s",
                   8.0 * (double)kn_type_block_bytes(t) / (double)kn_type_block_elems(t));
    if (elems)
        printf("  all     %5lld tensors  %6.3f bits per weight\n", (long long)rt_gguf_n_tensors(g),
               8.0 * (double)bytes / (double)elems);
}

static int cmd_inspect(int argc, char **argv)
{
    static const struct option opts[] = {
        {"ctx", required_argument, 0, 'c'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    long ctx = -1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
        if (c == 'c' && !gw_parse_int(optarg, 1, 1 << 24, &ctx))
            continue;
        fprintf(stderr, "usage: infergate model inspect FILE [--ctx N]\n"
                        "  --ctx N   context length for the memory estimate (default: the model's)\n");
        return c == 'h' ? 0 : 2;
    }
    if (optind != argc - 1) {
        fprintf(stderr, "usage: infergate model inspect FILE [--ctx N]\n");
        return 2;
    }
    const char *path = argv[optind];
    char err[512];
    rt_gguf *g;
    int rc = rt_gguf_open(path, &g, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "model inspect: %s\n", err); /* it names the path */
        return 1;
    }
    rt_hparams hp;
    rc = rt_hparams_from_gguf(g, &hp, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "model inspect: %s: %s\n", path, err);
        rt_gguf_free(g);
        return 1;
    }
    rt_gguf_str name = {"", 0};
    rt_gguf_get_str(g, "general.name", &name);
    printf("file:          %s (GGUF v%u, alignment %u)\n", path, rt_gguf_version(g), rt_gguf_alignment(g));
    char text[200];
    printf("name:          %s\n", rt_gguf_printable(text, sizeof(text), name));
    printf("architecture:  %s\n", hp.arch);
    printf("context:       %d\n", hp.n_ctx_train);
    printf("embedding:     %d\n", hp.n_embd);
    printf("layers:        %d\n", hp.n_layer);
    printf("heads:         %d (kv %d, head dim %d%s)\n", hp.n_head, hp.n_head_kv, hp.head_dim,
           hp.n_head_kv < hp.n_head ? ", grouped-query" : "");
    printf("feed-forward:  %d\n", hp.n_ff);
    printf("rope:          %d dims, base %g, %s\n", hp.n_rot, hp.rope_freq_base, hp.rope_neox ? "neox" : "normal");
    static const char *const scalings[] = {"none", "linear", "yarn", "longrope"};
    if (hp.rope_scaling != RT_ROPE_SCALING_NONE && (hp.rope_scale != 1.0f || hp.rope_scaling > 1))
        printf("rope scaling:  %s x%g (original context %d)\n", scalings[hp.rope_scaling], hp.rope_scale,
               hp.n_ctx_orig);
    if (hp.n_expert > 0)
        printf("experts:       %d, %d used a token (feed-forward %d each%s)\n", hp.n_expert, hp.n_expert_used,
               hp.n_ff_exp, hp.n_ff_shexp ? ", and a shared one" : "");
    if (hp.n_swa > 0)
        printf("sliding window: %d positions on the family's local layers\n", hp.n_swa);
    if (hp.attn_softcap > 0 || hp.final_softcap > 0)
        printf("soft-caps:     attention %g, final logits %g\n", hp.attn_softcap, hp.final_softcap);
    printf("rms epsilon:   %g\n", hp.norm_eps);
    printf("vocab:         %d%s\n", hp.n_vocab, hp.tied_output ? " (output tied to embeddings)" : "");

    rt_tokenizer *tok = NULL;
    int status = 0;
    if (rt_tokenizer_load(g, &tok, err, sizeof(err)) == 0) {
        printf("tokenizer:     %s, %d tokens, bos %d, eos %d\n", rt_tokenizer_kind_name(tok),
               rt_tokenizer_n_vocab(tok), rt_tokenizer_bos(tok), rt_tokenizer_eos(tok));
        rt_tokenizer_free(tok);
    } else {
        printf("tokenizer:     unusable: %s\n", err);
        status = 1; /* the runtime would refuse the file */
    }
    rt_gguf_str tmpl;
    if (rt_gguf_get_str(g, "tokenizer.chat_template", &tmpl) == 0)
        printf("chat template: %llu bytes\n", (unsigned long long)tmpl.n);

    printf("\ntensors:\n");
    uint64_t total = 0;
    int64_t n = rt_gguf_n_tensors(g);
    for (int64_t i = 0; i < n; i++) {
        const rt_gguf_tensor *t = rt_gguf_tensor_at(g, i);
        char shape[96] = "";
        int o = 0;
        for (uint32_t d = 0; d < t->n_dims; d++)
            o += snprintf(shape + o, sizeof(shape) - (size_t)o, d ? " x %lld" : "%lld", (long long)t->ne[d]);
        char b[32];
        human_bytes(t->nbytes, b, sizeof(b));
        printf("  %-32s %-5s %-20s %s\n", rt_gguf_printable(text, sizeof(text), t->name),
               kn_type_name(t->type), shape, b);
        total += t->nbytes;
    }
    print_types(g);
    if (ctx <= 0)
        ctx = hp.n_ctx_train;
    /* K and V of every layer in halves (the default kv_type f16), in
     * double: the file's hyper-parameters could wrap a 64-bit product */
    double kv_d = 2.0 * hp.n_layer * hp.n_head_kv * hp.head_dim * 2.0 * (double)ctx;
    uint64_t kv = kv_d < 1.8e19 ? (uint64_t)kv_d : UINT64_MAX;
    char tb[32], kb[32], sb[32];
    human_bytes(total, tb, sizeof(tb));
    human_bytes(kv, kb, sizeof(kb));
    human_bytes(total > UINT64_MAX - kv ? UINT64_MAX : total + kv, sb, sizeof(sb));
    printf("\n%lld tensors, %s of weights (%llu bytes)\n", (long long)n, tb, (unsigned long long)total);
    printf("memory for one sequence of %ld tokens: %s weights + %s KV cache (f16) = %s\n", ctx, tb, kb, sb);
    rt_gguf_free(g);
    return status;
}

static void quantize_usage(FILE *f)
{
    fprintf(f,
            "usage: infergate model quantize IN.gguf OUT.gguf TYPE [--pure] [--threads N]\n"
            "Converts a model with F32, F16 or BF16 weights into TYPE, a name of llama.cpp's quantize\n"
            "tool, with its mixture: Q4_K_M keeps the output matrix at Q6_K and gives attn_v and\n"
            "ffn_down Q6_K in some layers, as llama.cpp does; 1-D tensors and norms stay as they are.\n"
            "All metadata is kept (general.file_type becomes TYPE's number).\n"
            "  TYPE           %s\n"
            "  --pure         TYPE's type for every matrix (but where its block does not divide the rows)\n"
            "  --threads N    threads (default: the CPUs this process may use)\n",
            rt_ftype_names());
}

/* One line, rewritten per tensor, where stderr is a terminal. */
static void quantize_progress(void *arg, int64_t i, int64_t n, const char *name, kn_type from, kn_type to)
{
    (void)arg;
    if (!isatty(STDERR_FILENO))
        return;
    if (name == NULL) {
        fprintf(stderr, "\r\033[K");
        return;
    }
    fprintf(stderr, "\r\033[K[%4lld/%lld] %-36s %s -> %s", (long long)i + 1, (long long)n, name,
            kn_type_name(from), kn_type_name(to));
    fflush(stderr);
}

static int cmd_quantize(int argc, char **argv)
{
    static const struct option opts[] = {{"pure", no_argument, 0, 'p'},
                                         {"threads", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    rt_quant_opts o = {.progress = quantize_progress};
    long threads = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'p') {
            o.pure = true;
        } else if (c == 't' && !gw_parse_int(optarg, 1, 4096, &threads)) {
            o.n_threads = (int)threads;
        } else {
            quantize_usage(c == 'h' ? stdout : stderr);
            return c == 'h' ? 0 : 2;
        }
    }
    if (optind != argc - 3) {
        quantize_usage(stderr);
        return 2;
    }
    const char *in = argv[optind], *out = argv[optind + 1];
    if (rt_ftype_from_name(argv[optind + 2], &o.ftype)) {
        fprintf(stderr, "model quantize: TYPE must be one of %s, not '%s'\n", rt_ftype_names(),
                argv[optind + 2]);
        return 2;
    }
    char err[1024];
    rt_quant_stats st;
    if (rt_quantize_file(in, out, &o, &st, err, sizeof(err))) {
        quantize_progress(NULL, 0, 0, NULL, KN_TYPE_F32, KN_TYPE_F32);
        fprintf(stderr, "model quantize: %s\n", err);
        return 1;
    }
    char bi[32], bo[32];
    human_bytes(st.bytes_in, bi, sizeof(bi));
    human_bytes(st.bytes_out, bo, sizeof(bo));
    printf("wrote %s: %s%s, %lld tensors (%lld quantized, %lld fell back to another type), %s -> %s\n", out,
           rt_ftype_name(o.ftype), o.pure ? " (pure)" : "", (long long)st.n_tensors,
           (long long)st.n_quantized, (long long)st.n_fallback, bi, bo);
    return 0;
}

int gw_cmd_model(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "quantize"))
        return cmd_quantize(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "gen"))
        return cmd_gen(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "inspect"))
        return cmd_inspect(argc - 1, argv + 1);
    fprintf(stderr, "usage: infergate model gen|inspect|quantize ...\n");
    return 2;
}
