/*
 * cmd_tokenize.c — `tpinfer tokenize` (not built yet).
 */
#include <stdio.h>

#include "cli.h"

int cmd_tokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tpinfer tokenize: not available in this build yet\n");
    return 1;
}
