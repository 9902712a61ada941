/* libFuzzer target for the HTTP/2 server: the input is what a peer sends
 * after the client preface (which is prepended, so that the fuzzer spends
 * its time on frames, not on the 24 magic bytes). It goes through a
 * socketpair into a real server connection on a libevent loop, with a
 * handler that answers every request in one of the ways the API allows
 * (fuzz_http_server.h). The loop runs until the connection is idle, the
 * peer end is closed, and then every stream must be closed and every
 * connection gone.
 *
 * Build: cmake -B build-fuzz -DCMAKE_C_COMPILER=clang -DINFERGATE_FUZZ=ON
 *        && cmake --build build-fuzz --target fuzz_h2_server
 * Run:   ./build-fuzz/fuzz_h2_server -max_total_time=180 CORPUS_DIR */
#include "fuzz_http_server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char magic[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    return fz_server_run(magic, sizeof(magic) - 1, data, size);
}
