/*
 * main.c — `tpinfer` entry point: dispatch to a subcommand.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#ifndef TPI_BUILD_COMMIT
#define TPI_BUILD_COMMIT "unknown"
#endif

const char *cli_build_commit(void) { return TPI_BUILD_COMMIT; }

struct subcommand {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
};

static const struct subcommand commands[] = {
    {"run", cmd_run, "generate from prompts (-p TEXT, or -f FILE for a batch)"},
    {"bench", cmd_bench, "prompt-processing / generation benchmark (llama-bench format)"},
    {"perplexity", cmd_perplexity, "perplexity of a text file"},
    {"comm", cmd_comm, "communicator sanity check and bandwidth sweep"},
    {"info", cmd_info, "show a GGUF file's metadata, tensors and shard plan"},
    {"tokenize", cmd_tokenize, "tokenize text with a model's vocabulary"},
    {"mkmodel", cmd_mkmodel, "write a synthetic Qwen2/Qwen3 GGUF model"},
};

static void usage(FILE *out) {
    fprintf(out, "usage: tpinfer COMMAND [options]   (tpinfer COMMAND --help for details)\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-11s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "\nMulti-GPU: mpirun -np N tpinfer run --tp N ...  (see launch/)\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("tpinfer %s\n", cli_build_commit());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "tpinfer: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
