/*
 * main.c — `tpinfer` entry point: dispatch to a subcommand.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#if defined(__has_include)
#if __has_include("tpi_build_commit.h")
#include "tpi_build_commit.h" /* generated at every build (cmake/build_commit.cmake) */
#endif
#endif
#ifndef TPI_BUILD_COMMIT
#define TPI_BUILD_COMMIT "unknown"
#endif

const char *cli_build_commit(void) { return TPI_BUILD_COMMIT; }
long cli_build_number(void) { return TPI_BUILD_NUMBER; }

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
    fprintf(out, "Any command: --debug-comm sets NCCL_DEBUG=INFO (INIT,NET) on every rank.\n");
    fprintf(out, "tpinfer --version prints the version.\n");
}

/* A command's exit status once its stdout is flushed: a result that could not be written
 * (a full disk, a closed pipe's EPIPE with SIGPIPE ignored) makes it 1, with one line. */
static int finish(const char *cmd, int rc) {
    errno = 0;
    const bool flush_failed = fflush(stdout) != 0;
    if (flush_failed || ferror(stdout)) {
        fprintf(stderr, "tpinfer%s%s: cannot write the output (stdout)%s%s\n", cmd ? " " : "",
                cmd ? cmd : "", flush_failed && errno ? ": " : "",
                flush_failed && errno ? strerror(errno) : "");
        if (rc == 0) rc = 1;
    }
    return rc;
}

int main(int argc, char **argv) {
    // The CPU backend's OpenMP threads must sleep, not spin, at barriers: ranks and
    // other work share the cores, and a spinning thread that holds up a barrier
    // slows a step by 10-100x (measured: 4 vs 180 t/s under load). libgomp reads
    // OMP_WAIT_POLICY before main runs, so set it and start again once; a user's own
    // setting is kept.
    if (!getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        execv("/proc/self/exe", argv);
        // exec failed (no /proc): carry on with the default policy
    }
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return finish(NULL, 0);
    }
    if (!strcmp(argv[1], "--version")) {
        printf("tpinfer %s\n", cli_build_commit());
        return finish(NULL, 0);
    }
    // --debug-comm works with every subcommand: NCCL reads its variables at init, so
    // they are set here, before any communicator exists (on every rank, since every
    // rank runs this main). Variables the user set win.
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--debug-comm")) continue;
        setenv("NCCL_DEBUG", "INFO", 0);
        setenv("NCCL_DEBUG_SUBSYS", "INIT,NET", 0);
        for (int j = i; j < argc; j++) argv[j] = argv[j + 1];
        argc--;
        i--;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return finish(commands[i].name, commands[i].fn(argc - 1, argv + 1));
    fprintf(stderr, "tpinfer: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
