/*
 * cmd_mkmodel.c — `tpinfer mkmodel` (not built yet).
 */
#include <stdio.h>

#include "cli.h"

int cmd_mkmodel(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tpinfer mkmodel: not available in this build yet\n");
    return 1;
}
