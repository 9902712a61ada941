/* kernels: the AVX-VNNI backend. The AVX2 table with the quantized dots and
 * gemm rebuilt on vpdpbusd (unsigned x signed bytes summed straight into
 * int32 lanes), which replaces vpmaddubsw + vpmaddwd and lets Q8_0 use the
 * offset trick and the transposed gemm layout too (see qdot_x86.h), and so
 * are the packed gemms of Q5_0, Q5_1, IQ4_NL and MXFP4 (packed_x86.h; built
 * with -ffp-contract=off, as they must round as the reference).
 * Everything else is the AVX2 code. The file gets the AVX2 flags from the build; the VNNI functions
 * carry their own target attribute, and kn_ops_avxvnni() checks the CPU before
 * any of them can run. */
#include "kernels/kn.h"
#include "kernels/kn_pack.h"
#include "kernels/quant_blocks.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/x86/ops_x86.h"

#define QD_VNNI 1
#define QD_FN(n) vnni_##n
#define QD_ATTR __attribute__((target("avxvnni")))
#include "kernels/x86/qdot_x86.h"

#define PA_VNNI 1
#define PA_FN(n) vnni_##n
#define PA_ATTR __attribute__((target("avxvnni")))
#include "kernels/x86/packed_x86.h"

static kn_ops ops_vnni;
static pthread_once_t ops_vnni_once = PTHREAD_ONCE_INIT;

static void ops_vnni_init(void)
{
    ops_vnni = *kn_ops_avx2();
    ops_vnni.name = "avxvnni";
    ops_vnni.dot[KN_TYPE_Q8_0] = vnni_dot_q8_0;
    ops_vnni.dot[KN_TYPE_Q4_0] = vnni_dot_q4_0;
    ops_vnni.gemm[KN_TYPE_Q8_0] = vnni_gemm_q8_0;
    ops_vnni.gemm[KN_TYPE_Q4_0] = vnni_gemm_q4_0;
    vnni_packed_fill(&ops_vnni);
}

const kn_ops *kn_ops_avxvnni(void)
{
    unsigned a, b, c, d;
    /* the AVX2 table first: it checks AVX2/FMA/F16C and fills the scale
     * table these dots read */
    if (kn_ops_avx2() == NULL)
        return NULL;
    /* AVX-VNNI is CPUID leaf 7, subleaf 1, EAX bit 4 */
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 4)))
        return NULL;
    pthread_once(&ops_vnni_once, ops_vnni_init);
    return &ops_vnni;
}

#else

const kn_ops *kn_ops_avxvnni(void)
{
    return NULL;
}

#endif
