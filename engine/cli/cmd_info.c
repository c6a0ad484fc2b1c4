/*
 * cmd_info.c — `tpinfer info` (not built yet).
 */
#include <stdio.h>

#include "cli.h"

int cmd_info(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tpinfer info: not available in this build yet\n");
    return 1;
}
