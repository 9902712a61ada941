/* infergate: one binary, several commands (serve, worker, model, generate). */
#include "gateway/cmd/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: infergate <command> [options]\n"
               "\n"
               "commands:\n"
               "  model gen --out FILE [--arch --dim --layers --heads --kv-heads --ffn --experts --experts-used --vocab --ctx --type --seed]\n"
               "                        write a synthetic llama-family GGUF (random weights)\n"
               "  model inspect FILE [--ctx N]\n"
               "                        print a GGUF model's architecture, tensors and memory needs\n"
               "  model quantize IN.gguf OUT.gguf TYPE [--pure]\n"
               "                        quantize a model as llama.cpp's tool does (Q4_K_M, Q8_0 ...)\n"
               "  serve [--config FILE]  run the gateway of one region (default: a demo model on\n"
               "                        127.0.0.1:8080, no keys)\n"
               "  worker --model FILE --listen unix:PATH|tcp:HOST:PORT [options]\n"
               "                        serve one model over HTTP/2 (OpenAI API, continuous batching)\n"
               "  generate --model FILE --prompt TEXT [-n N --temp T ...]\n"
               "                        run one prompt offline and print the text and tokens/s\n"
               "  key new | key hash KEY|-\n"
               "                        make a tenant API key and its SHA-256 for the config\n"
               "  region set-price REGION --input X --output Y [--redis HOST:PORT --cluster NAME ...]\n"
               "                        change a region's price for the whole fleet (through Redis)\n"
               "  usage [--tenant T] [--since YYYY-MM-DD] [--redis HOST:PORT | --config FILE ...]\n"
               "                        print tokens, spend and gCO2e by tenant, model and region\n"
               "  region set-carbon REGION --carbon G [--redis HOST:PORT --cluster NAME ...]\n"
               "                        its grid carbon intensity (gCO2e/kWh), the same way\n"
               "  region drain|undrain REGION [--redis HOST:PORT --cluster NAME ...]\n"
               "                        no new requests to a region (its streams finish), and back\n"
               "\n"
               "`infergate <command> --help` describes each command.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "model"))
        return gw_cmd_model(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve"))
        return gw_cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "worker"))
        return gw_cmd_worker(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate"))
        return gw_cmd_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "key"))
        return gw_cmd_key(argc - 1, argv + 1);
    if (!strcmp(cmd, "region"))
        return gw_cmd_region(argc - 1, argv + 1);
    if (!strcmp(cmd, "usage"))
        return gw_cmd_usage(argc - 1, argv + 1);
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "infergate: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
