/*
 * cmd_run.c — `tpinfer run` (not built yet).
 */
#include <stdio.h>

#include "cli.h"

int cmd_run(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tpinfer run: not available in this build yet\n");
    return 1;
}
