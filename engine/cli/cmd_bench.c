/*
 * cmd_bench.c — `tpinfer bench` (not built yet).
 */
#include <stdio.h>

#include "cli.h"

int cmd_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tpinfer bench: not available in this build yet\n");
    return 1;
}
