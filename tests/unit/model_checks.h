/* Checks of a loaded model that several unit tests make (test_model,
 * test_arch, test_quantize, test_cuda_kernels): loading, greedy decoding,
 * logits compared by cosine, and a batch of sequences against each alone.
 * They fail the calling cmocka test with a message naming what failed. */
#ifndef TESTS_MODEL_CHECKS_H
#define TESTS_MODEL_CHECKS_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/model.h"

/* The model at path on device (NULL: the CPU), `threads` compute threads,
 * the scalar reference kernels when `reference`. */
rt_model *mc_load(const char *path, const char *device, bool reference, int threads);

int mc_argmax(const float *x, int n);
double mc_cosine(const float *a, const float *b, int n);

/* The prompt prefilled whole, then n greedy tokens one a step into out;
 * each step's logits into logits[i * n_vocab] when logits is not NULL. */
void mc_greedy(rt_model *m, const int32_t *prompt, int n_prompt, int32_t *out, int n, float *logits);

/* n_seq sequences (the prompt's tokens from offset s, 3 + s of them), each
 * decoded greedily alone for n_gen tokens, then all as one batch a step:
 * the tokens must be the same. n_seq <= 8, n_gen <= 16, n_prompt >= n_seq + 2. */
void mc_batch_matches_alone(rt_model *m, const int32_t *prompt, int n_prompt, int n_seq, int n_gen,
                            const char *what);

#endif
