/* Checks for the programs that tests/runtime's scripts run once per rank under mpiexec
 * (comm_ranks.c, dp_parity.c): they are plain programs, not cmocka suites, so that each rank
 * reports on its own and the script judges the job by exit codes and "checks passed" lines. */
#ifndef LOOM_TESTS_RANK_CHECK_H
#define LOOM_TESTS_RANK_CHECK_H

#include <stdbool.h>
#include <stdio.h>

#include "loom/loom.h"

/* This process's rank (set by the program after loom_dist_init), the checks made so far and
 * how many failed. */
extern int rank_, checks, failures;

/* Counts a check; when cond is false, prints the rank, the place, the condition and the
 * printf-style message to stderr, and counts a failure. Never aborts. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "rank %d: %s:%d: FAIL %s: ", rank_, __FILE__, __LINE__, #cond);        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

/* A context on this rank's default device without the disk cache (NULL, after a failed
 * check, when it cannot be created). */
loom_context *new_context(bool eager);

#endif
