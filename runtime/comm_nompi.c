/* The MPI backend of a Loom built without MPI: asking for it is a clear error. */
#include "comm.h"

bool loom_rt_comm_mpi_available(void) {
    return false;
}

loom_status loom_rt_comm_mpi_create(const loom_allocator *a, int64_t timeout_ns, loom_rt_comm **out,
                                    loom_ir_diag *d) {
    return loom_ir_diag_set(d, LOOM_STATUS_UNSUPPORTED,
                            "dist: the mpi backend was asked for, but this Loom was built "
                            "without MPI (install libmpich-dev and reconfigure)");
}
