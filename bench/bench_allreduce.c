/* All-reduce through Loom's communicator (runtime/comm.h: non-blocking post, polled wait,
 * scale, bf16 staged in f32) against a bare blocking MPI_Allreduce of the same bytes.
 * Run under mpiexec: `mpiexec -n 2 build/bench/bench_allreduce [--runs N] [--mb M,...]`. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "loom/dist.h"
#include "runtime/comm.h"

/* BARE_NB_F32: MPI_Iallreduce then MPI_Wait, the MPI calls Loom's non-blocking path makes
 * (it polls with MPI_Test instead of waiting), to tell MPI's non-blocking algorithm's cost
 * from Loom's own (scale, polling, staging). */
typedef enum { BARE_F32, BARE_NB_F32, LOOM_F32, LOOM_BF16 } variant;

/* Median seconds of one all-reduce of n elements, the slowest rank's per sample. */
static double measure(variant v, loom_rt_comm *c, void *buf, size_t n, int runs) {
    double *samples = malloc(sizeof(double) * (size_t)runs);
    if (!samples)
        return -1;
    loom_ir_diag d;
    for (int r = -2; r < runs; r++) { /* two warm-ups */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = bench_now();
        loom_status st = LOOM_OK;
        loom_ir_diag_init(&d);
        switch (v) {
        case BARE_F32:
            st = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) ==
                         MPI_SUCCESS
                     ? LOOM_OK
                     : LOOM_STATUS_COMM_ERROR;
            break;
        case BARE_NB_F32: {
            MPI_Request req;
            st = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                                &req) == MPI_SUCCESS &&
                         MPI_Wait(&req, MPI_STATUS_IGNORE) == MPI_SUCCESS
                     ? LOOM_OK
                     : LOOM_STATUS_COMM_ERROR;
            break;
        }
        case LOOM_F32:
            st = loom_rt_comm_allreduce(c, buf, n, LOOM_DTYPE_F32, LOOM_REDUCE_SUM, 1.0 / c->size,
                                        &d);
            break;
        case LOOM_BF16:
            st = loom_rt_comm_allreduce(c, buf, n, LOOM_DTYPE_BF16, LOOM_REDUCE_SUM, 1.0 / c->size,
                                        &d);
            break;
        }
        double t = bench_now() - t0;
        if (st != LOOM_OK) {
            fprintf(stderr, "all-reduce failed: %s\n", d.msg);
            free(samples);
            return -1;
        }
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (r >= 0)
            samples[r] = t;
    }
    double m = bench_median(samples, runs);
    free(samples);
    return m;
}

int main(int argc, char **argv) {
    int runs = 9;
    const char *mbs = "0.004,1,25";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--mb") == 0 && i + 1 < argc)
            mbs = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--runs N] [--mb M,...]\n", argv[0]);
            return 2;
        }
    }
    if (runs < 1)
        runs = 1;
    loom_dist_options o;
    loom_dist_options_init(&o);
    o.backend = LOOM_DIST_BACKEND_MPI;
    if (loom_dist_init(&o) != LOOM_OK) {
        fprintf(stderr, "%s\n", loom_dist_error_message());
        return 1;
    }
    loom_rt_comm *c = loom_rt_comm_world();
    if (c->rank == 0)
        printf("all-reduce (sum, scale 1/N) on %d ranks, median of %d, slowest rank\n"
               "%10s %14s %16s %14s %8s %14s\n",
               (int)c->size, runs, "MB (f32)", "MPI f32 ms", "MPI Iallreduce", "Loom f32 ms",
               "ratio", "Loom bf16 ms");
    int rc = 0;
    char *list = strdup(mbs);
    for (char *tok = strtok(list, ","); tok && rc == 0; tok = strtok(NULL, ",")) {
        size_t n = (size_t)(atof(tok) * 1e6 / 4);
        if (n == 0)
            n = 1;
        float *buf = calloc(n, sizeof(float));
        if (!buf) {
            rc = 1;
            break;
        }
        double bare = measure(BARE_F32, c, buf, n, runs);
        double bare_nb = measure(BARE_NB_F32, c, buf, n, runs);
        double loom = measure(LOOM_F32, c, buf, n, runs);
        double bf16 = measure(LOOM_BF16, c, buf, n, runs); /* first n/2 floats' bytes */
        free(buf);
        if (bare < 0 || bare_nb < 0 || loom < 0 || bf16 < 0) {
            rc = 1;
            break;
        }
        if (c->rank == 0)
            printf("%10.3f %14.3f %16.3f %14.3f %8.2f %14.3f\n", n * 4 / 1e6, bare * 1e3,
                   bare_nb * 1e3, loom * 1e3, loom / bare, bf16 * 1e3);
    }
    free(list);
    if (loom_dist_finalize() != LOOM_OK) {
        fprintf(stderr, "%s\n", loom_dist_error_message());
        rc = 1;
    }
    return rc;
}
