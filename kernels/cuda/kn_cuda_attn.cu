/* kernels/cuda: causal attention over the paged F16 KV cache.
 *
 * One thread block per (token, head, key split). Each warp takes keys in
 * turn, ATTN_KEYS at a time so that several K rows are in flight: the lanes
 * split the head dimension (a half2 each per 64 dims), a warp sum gives the
 * score, and an online softmax (running max and sum, rescaled accumulators)
 * folds the V rows in, all in F32. The warps then merge their partial
 * results in shared memory. The same kernel serves prefill chunks (each
 * token sees its own prefix) and decode. When a step has few tokens —
 * decode at small batch — the keys of each token are split over several
 * blocks and a second kernel merges the parts (flash-decoding), so that one
 * token still occupies the whole device. Sliding windows, soft-capped
 * scores and attention sinks (kn_cuda_attn) are the CPU's
 * kn_attention_ex's. */
#include "kernels/cuda/kn_cuda_internal.cuh"

#define ATTN_WARPS 4
#define ATTN_KEYS 4
#define ATTN_MAX_HD 256
#define ATTN_MAX_SPLIT 16

/* NP: half2 pairs per lane (head_dim <= 64 * NP). */
template <int NP>
__global__ void __launch_bounds__(ATTN_WARPS *KN_WARP) attn_kernel(kn_cuda_attn a, int n_split, float *part)
{
    kn_pdl_begin();
    const int t = blockIdx.x, h = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x % KN_WARP, warp = threadIdx.x / KN_WARP;
    const int hd = a.head_dim;
    const int kvh = h / (a.n_head / a.n_kv_head);
    const size_t kv_dim = (size_t)a.n_kv_head * hd;
    const int n_keys = a.d_pos[t] + 1;
    /* a sliding window's first key; the table holds nothing below it */
    const int lo = a.window > 0 && n_keys - a.window > 0 ? n_keys - a.window : 0;
    const int32_t *table = a.d_tables + a.d_table_off[a.d_tok_seq[t]];
    const int per = (n_keys - lo + n_split - 1) / n_split;
    const int p_begin = lo + split * per;
    const int p_end = min(n_keys, p_begin + per);

    float2 q[NP], acc[NP];
    const float *qrow = a.d_q + ((size_t)t * a.n_head + h) * hd;
#pragma unroll
    for (int i = 0; i < NP; i++) {
        const int d = 2 * lane + 64 * i;
        q[i] = d < hd ? make_float2(qrow[d], qrow[d + 1]) : make_float2(0.0f, 0.0f);
        acc[i] = make_float2(0.0f, 0.0f);
    }
    float m = -INFINITY, l = 0.0f;

    for (int p0 = p_begin + warp * ATTN_KEYS; p0 < p_end; p0 += ATTN_WARPS * ATTN_KEYS) {
        const __half *base[ATTN_KEYS];
        float sc[ATTN_KEYS];
        /* V rows are loaded with the K rows, not after the scores: one
         * memory latency per group of keys instead of two. */
        __half2 vr[ATTN_KEYS][NP];
#pragma unroll
        for (int k = 0; k < ATTN_KEYS; k++) {
            const int p = p0 + k;
            float s = 0.0f;
            base[k] = NULL;
#pragma unroll
            for (int i = 0; i < NP; i++)
                vr[k][i] = __float2half2_rn(0.0f);
            if (p < p_end) {
                const int blk = table[p / a.block_tokens];
                base[k] = (const __half *)a.d_pool + (size_t)blk * a.block_elems +
                          (size_t)(p % a.block_tokens) * kv_dim + (size_t)kvh * hd;
                const __half2 *kr = (const __half2 *)(base[k] + a.k_off);
                const __half2 *vrow = (const __half2 *)(base[k] + a.v_off);
#pragma unroll
                for (int i = 0; i < NP; i++) {
                    if (2 * lane + 64 * i < hd) {
                        vr[k][i] = vrow[lane + 32 * i];
                        const float2 kf = __half22float2(kr[lane + 32 * i]);
                        s += q[i].x * kf.x + q[i].y * kf.y;
                    }
                }
            }
            sc[k] = s;
        }
        /* ATTN_KEYS independent reductions, interleaved. */
#pragma unroll
        for (int o = KN_WARP / 2; o > 0; o >>= 1)
#pragma unroll
            for (int k = 0; k < ATTN_KEYS; k++)
                sc[k] += __shfl_xor_sync(0xffffffffu, sc[k], o);
        float mx = m;
#pragma unroll
        for (int k = 0; k < ATTN_KEYS; k++) {
            sc[k] *= a.scale;
            if (a.softcap > 0.0f)
                sc[k] = a.softcap * tanhf(sc[k] / a.softcap);
            if (base[k])
                mx = fmaxf(mx, sc[k]);
        }
        /* p0 < p_end: key 0 is real, so mx is finite and corr well defined
         * (exp(-inf) = 0 on the first keys). */
        const float corr = expf(m - mx);
        l *= corr;
#pragma unroll
        for (int i = 0; i < NP; i++) {
            acc[i].x *= corr;
            acc[i].y *= corr;
        }
#pragma unroll
        for (int k = 0; k < ATTN_KEYS; k++) {
            if (!base[k])
                continue;
            const float pk = expf(sc[k] - mx);
            l += pk;
#pragma unroll
            for (int i = 0; i < NP; i++) {
                if (2 * lane + 64 * i < hd) {
                    const float2 vf = __half22float2(vr[k][i]);
                    acc[i].x += pk * vf.x;
                    acc[i].y += pk * vf.y;
                }
            }
        }
        m = mx;
    }

    /* Merge the warps. A warp that saw no key has m = -inf and l = 0. */
    __shared__ float sm[ATTN_WARPS], sl[ATTN_WARPS];
    __shared__ float sacc[ATTN_WARPS][ATTN_MAX_HD];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < NP; i++) {
        const int d = 2 * lane + 64 * i;
        if (d < hd) {
            sacc[warp][d] = acc[i].x;
            sacc[warp][d + 1] = acc[i].y;
        }
    }
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; w++)
        M = fmaxf(M, sm[w]);
    float wgt[ATTN_WARPS], L = 0.0f;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; w++) {
        wgt[w] = sm[w] == -INFINITY ? 0.0f : expf(sm[w] - M);
        L += sl[w] * wgt[w];
    }
    const size_t th = (size_t)t * a.n_head + h;
    if (n_split == 1) {
        /* Every token sees at least itself: L > 0. A sink adds to the sum
         * only (M is finite: the token's own key). */
        if (a.d_sinks)
            L += expf(a.d_sinks[h] - M);
        float *out = a.d_out + th * hd;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float num = 0.0f;
#pragma unroll
            for (int w = 0; w < ATTN_WARPS; w++)
                num += sacc[w][d] * wgt[w];
            out[d] = num / L;
        }
        return;
    }
    /* Unnormalised part: acc[hd], then the max and the sum. */
    float *pp = part + (th * n_split + split) * (size_t)(hd + 2);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float num = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; w++)
            num += sacc[w][d] * wgt[w];
        pp[d] = num;
    }
    if (threadIdx.x == 0) {
        pp[hd] = M;
        pp[hd + 1] = L;
    }
}

/* One block per (token, head): out = sum_s acc_s e^(M_s - M) / sum_s L_s e^(M_s - M).
 * The first warp reads every split's max and sum at once (a lane each) and
 * leaves the weights in shared memory; then each thread sums its dimensions
 * over the splits with all loads in flight. */
__global__ void attn_merge_kernel(const float *__restrict__ part, int n_split, int hd,
                                  const float *__restrict__ sinks, int n_head, float *__restrict__ out)
{
    static_assert(ATTN_MAX_SPLIT <= KN_WARP, "one lane per split");
    kn_pdl_begin();
    __shared__ float wgt[ATTN_MAX_SPLIT], l_sum;
    const size_t th = blockIdx.x, stride = (size_t)hd + 2;
    const float *pp = part + th * n_split * stride;
    if (threadIdx.x < KN_WARP) {
        const int s = threadIdx.x;
        const float ms = s < n_split ? pp[s * stride + hd] : -INFINITY;
        const float ls = s < n_split ? pp[s * stride + hd + 1] : 0.0f;
        const float M = kn_warp_max(ms); /* finite: split 0 holds the first key */
        const float w = ms == -INFINITY ? 0.0f : expf(ms - M);
        const float L = kn_warp_sum(ls * w);
        if (s < ATTN_MAX_SPLIT)
            wgt[s] = w;
        if (s == 0)
            l_sum = sinks ? L + expf(sinks[th % n_head] - M) : L;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float num = 0.0f;
#pragma unroll
        for (int s = 0; s < ATTN_MAX_SPLIT; s++)
            if (s < n_split)
                num += pp[s * stride + d] * wgt[s];
        out[th * hd + d] = num / l_sum;
    }
}

/* Splits only when the blocks of a step would leave the device mostly idle:
 * aim at about four blocks per SM. Depends on the shape alone (not on the
 * context length), so a captured graph stays valid as sequences grow. */
static int attn_splits(const kn_cuda *c, int n_tokens, int n_head)
{
    const long blocks = (long)n_tokens * n_head;
    const long want = 4L * (c->sm_count > 0 ? c->sm_count : 1);
    if (blocks >= want / 2)
        return 1;
    long s = (want + blocks - 1) / blocks;
    return s > ATTN_MAX_SPLIT ? ATTN_MAX_SPLIT : (int)s;
}

static size_t part_bytes(int n_tokens, int n_head, int head_dim, int n_split)
{
    return n_split > 1 ? (size_t)n_tokens * n_head * n_split * (head_dim + 2) * sizeof(float) : 0;
}

extern "C" int kn_cuda_attention_reserve(kn_cuda *c, int n_tokens, int n_head, int head_dim)
{
    if (n_tokens <= 0 || n_head <= 0)
        return 0;
    const size_t need = part_bytes(n_tokens, n_head, head_dim, attn_splits(c, n_tokens, n_head));
    return need ? kn_cuda__scratch(c, &c->part, &c->part_cap, need) : 0;
}

extern "C" int kn_cuda_attention(kn_cuda *c, const kn_cuda_attn *a)
{
    if (a->n_tokens < 0 || a->n_head <= 0 || a->n_kv_head <= 0 || a->n_head % a->n_kv_head != 0 ||
        a->head_dim <= 0 || a->head_dim % 2 != 0 || a->head_dim > ATTN_MAX_HD || a->block_tokens <= 0 ||
        a->n_head > 65535 || a->window < 0)
        return KN_CUDA_EINVAL(c, "attention: unsupported shape (head_dim must be even and at most 256)");
    if (a->n_tokens == 0)
        return 0;
    const int n_split = attn_splits(c, a->n_tokens, a->n_head);
    int rc = kn_cuda_attention_reserve(c, a->n_tokens, a->n_head, a->head_dim);
    if (rc)
        return rc;
    const dim3 grid(a->n_tokens, a->n_head, n_split), block(ATTN_WARPS * KN_WARP);
    float *part = (float *)c->part;
    if (a->head_dim <= 64)
        kn_cuda__launch(c, grid, block, 0, attn_kernel<1>, *a, n_split, part);
    else if (a->head_dim <= 128)
        kn_cuda__launch(c, grid, block, 0, attn_kernel<2>, *a, n_split, part);
    else
        kn_cuda__launch(c, grid, block, 0, attn_kernel<4>, *a, n_split, part);
    KN_CUDA_LAUNCHED(c);
    if (n_split > 1) {
        kn_cuda__launch(c, a->n_tokens * a->n_head, 128, 0, attn_merge_kernel, part, n_split, a->head_dim,
                        a->d_sinks, a->n_head, a->d_out);
        KN_CUDA_LAUNCHED(c);
    }
    return 0;
}
