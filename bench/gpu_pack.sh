#!/bin/sh
# Packs a local build for a GPU machine that lacks our Debian dependencies:
# the binaries named below, the CUDA plugin (next to them in bin/, where they
# look for it: runtime/device.h), and every shared library they load from outside
# the CUDA toolkit (the GPU machine has its own CUDA 13 runtime and cuBLAS;
# the C library and loader stay the machine's own).
#
#   bench/gpu_pack.sh [BUILD_DIR] [DEST]      (default: build .gpu)
#
# DEST is meant to be ignored by git (.git/info/exclude) and carried with the
# command that runs bench/gpu_check.sh.
set -eu
build=${1:-build}
dest=${2:-.gpu}
bins="infergate test_cuda_kernels bench_cuda test_kernels test_model test_gguf test_sampler
test_tokenizer test_chat test_openai test_gpu_list"
plugins="libinfergate_cuda.so"
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib"
for b in $bins $plugins; do
    cp "$build/$b" "$dest/bin/"
    # debug sections only: the symbols the plugin resolves in the binary stay
    # (without this the pack passes the device tool's 64 MiB)
    strip --strip-debug "$dest/bin/$b"
    ldd "$build/$b" | awk '/=> \// { print $3 }' | while read -r lib; do
        case "$lib" in
        */cuda*/* | */libc.so* | */libm.so* | */libdl.so* | */libpthread.so* | */librt.so* | */ld-linux*) ;;
        *) cp -n "$lib" "$dest/lib/" ;;
        esac
    done
done
du -sh "$dest"
