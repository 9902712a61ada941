/* libFuzzer target for the HTTP/1.x server session: the input is what a
 * client sends on a cleartext connection (request heads, bodies in both
 * framings, pipelined requests, garbage; an input that starts with the
 * HTTP/2 preface goes to the HTTP/2 session instead, as on a real port).
 * It goes through a socketpair into a real server connection on a
 * libevent loop, with a handler that answers every request in one of the
 * ways the API allows, chosen by the path's second character
 * (fuzz_http_server.h). The loop runs until the connection is quiet, the
 * peer end is closed, and then every stream must be closed and the
 * connection gone.
 *
 * Build: cmake -B build-fuzz -DCMAKE_C_COMPILER=clang -DINFERGATE_FUZZ=ON
 *        && cmake --build build-fuzz --target fuzz_http1
 * Run:   ./build-fuzz/fuzz_http1 -dict=tests/fuzz/http1.dict -max_total_time=180 \
 *            CORPUS_DIR tests/fuzz/corpus_http1 */
#include "fuzz_http_server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fz_server_run(NULL, 0, data, size);
}
