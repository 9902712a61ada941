/* kernels: where things lie in the packed layouts of kn_pack.c, for the
 * packer and the packed gemms (kernels/x86) alike. Internal to kernels/.
 *
 * Everything is for a group of 16 rows, row j's values in dword j of a
 * 64-byte vector. A "quad" is 4 consecutive elements: a quad vector holds
 * each row's 4 quants of one quad as bytes once unpacked, so one vpdpbusd
 * against the activations' matching dword adds to the 16 rows' sums.
 *
 * K-quants and IQ4_XS: a group is its rows' super-blocks one after the
 * other, each KN_PK_*_BYTES (a multiple of 64). Quad i of a super-block is
 * elements 4i..4i+3; a unit u (0..3) is quads 16u..16u+15 (elements
 * 64u..64u+63). In a super-block, at the offsets below:
 *   d, dmin   16 halves each, row j's at j.
 *   scale pairs  for p = 0..7 (groups of 16: 2p and 2p + 1) or 0..3 (groups
 *             of 32), 32 bytes: row j's two scales at 2j, 2j + 1, so that
 *             one vpmovzxbw/vpmovsxbw makes the 16 rows' pairs; Q2_K keeps
 *             its byte (scale | min << 4) there, Q3_K and IQ4_XS the scale
 *             less 32 (signed), Q6_K its signed scale.
 *   min pairs (Q4_K, Q5_K) likewise.
 *   nib       32 vectors: vector 8u + k holds quad 16u + k in its low
 *             nibbles and quad 16u + 8 + k in its high ones (Q4_K, Q5_K and
 *             Q6_K their low 4 bits, IQ4_XS its level's index).
 *   lo2       16 vectors (Q2_K's 2 bits): vector 4u + a holds
 *             quad 16u + 4f + a in bits 2f..2f+1 of each byte, f = 0..3.
 *   hi2       16 vectors (Q6_K: bits 4-5): vector 4u + a holds, for k = a
 *             and a + 4, quad 16u + k in field k / 4 and quad 16u + 8 + k
 *             in field 2 + k / 4 (field f: bits 2f..2f+1).
 *   hbit      64 masks of 64 bits, one per quad (Q5_K's bit 4): bit
 *             4j + e for row j's element e of the quad.
 *   q3        24 vectors (Q3_K: its 3 bits, the low 2 and the high one):
 *             quads 8c..8c+7 (c = 0..7) in vectors 3c..3c+2, each byte of
 *             vector 3c + v holding quad 8c + 2v in bits 0-2 and quad
 *             8c + 2v + 1 in bits 3-5; quad 8c + 6's low 2 bits in bits 6-7
 *             of vector 3c, quad 8c + 7's of vector 3c + 1, and their high
 *             bits in bits 6 and 7 of vector 3c + 2: six quads a shift or
 *             a mask away, two an or of two.
 *
 * The 32-element types (Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4) as kn_pack_q4_0
 * lays out Q4_0: a group holds first its blocks' scales, KN_PL_*_SCALE bytes
 * a block (16 halves of d, then for Q4_1 and Q5_1 16 halves of m; MXFP4's
 * 16 E8M0 exponent bytes, whose 2^-128..2^127 no half holds), padded to whole
 * cache lines, then its blocks' quants, KN_PL_*_QUANT bytes a block: 4
 * vectors, vector k with quad k in its low nibbles and quad 4 + k in its
 * high ones (Q4_0's byte order: element i and i + 16 share a byte; IQ4_NL's
 * and MXFP4's the index of the level). Q5_0 and Q5_1 have a fifth vector,
 * and their bits otherwise placed: vector k holds quad k's 5 bits in bits
 * 0-4 and quad 4 + k's low 3 in bits 5-7, the fifth vector quad 4 + k's top
 * 2 in bits 2k..2k+1, so that every quad is a mask or two bit-field moves
 * away (the 8 quads' hbit masks, added by mask, cost Q5_1's decode a
 * quarter of its speed). */
#ifndef KN_PACK_H
#define KN_PACK_H

/* Q4_K */
#define KN_PK_Q4K_D 0
#define KN_PK_Q4K_DMIN 32
#define KN_PK_Q4K_SC 64
#define KN_PK_Q4K_MN 192
#define KN_PK_Q4K_NIB 320
#define KN_PK_Q4K_BYTES 2368
/* Q5_K: Q4_K's, and the fifth bits */
#define KN_PK_Q5K_HBIT 2368
#define KN_PK_Q5K_BYTES 2880
/* Q6_K */
#define KN_PK_Q6K_D 0
#define KN_PK_Q6K_SC 32
#define KN_PK_Q6K_NIB 288
#define KN_PK_Q6K_HI2 2336
#define KN_PK_Q6K_BYTES 3392
/* Q3_K */
#define KN_PK_Q3K_D 0
#define KN_PK_Q3K_SC 32
#define KN_PK_Q3K_Q3 288
#define KN_PK_Q3K_BYTES 1856
/* Q2_K */
#define KN_PK_Q2K_D 0
#define KN_PK_Q2K_DMIN 32
#define KN_PK_Q2K_SCM 64
#define KN_PK_Q2K_LO2 320
#define KN_PK_Q2K_BYTES 1344
/* IQ4_XS */
#define KN_PK_IQ4XS_D 0
#define KN_PK_IQ4XS_SC 32
#define KN_PK_IQ4XS_NIB 160
#define KN_PK_IQ4XS_BYTES 2240

/* The 32-element types: a block's scales and quants. */
#define KN_PL_SCALE_D 32   /* d only (Q5_0, IQ4_NL) */
#define KN_PL_SCALE_DM 64  /* d, then m (Q4_1, Q5_1) */
#define KN_PL_SCALE_E8 16  /* the exponent bytes (MXFP4) */
#define KN_PL_QUANT_4 256  /* nibbles */
#define KN_PL_QUANT_5 320  /* 5 vectors */

#endif
