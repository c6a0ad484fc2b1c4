/*
 * cmd_perplexity.c — `tpinfer perplexity` (not built yet).
 */
#include <stdio.h>

#include "cli.h"

int cmd_perplexity(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tpinfer perplexity: not available in this build yet\n");
    return 1;
}
