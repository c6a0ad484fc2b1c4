/*
 * cmd_comm.c — `tpinfer comm` (not built yet).
 */
#include <stdio.h>

#include "cli.h"

int cmd_comm(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tpinfer comm: not available in this build yet\n");
    return 1;
}
