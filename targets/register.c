/* Registration of the built-in targets, and what their compilers share. */
#include <pthread.h>

#include "targets.h"

static void register_all(void) {
    /* static tables in a table of 8: these cannot fail */
    (void)loom_tg_register_npu();
    (void)loom_tg_register_ref();
}

void loom_tg_register_builtin(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_all);
}

loom_status loom_tg_keep_traced_graph(loom_rt_executable **exe, const loom_ir_graph *cut,
                                      loom_ir_diag *d) {
    loom_status st = loom_ir_graph_copy(&(*exe)->graph, cut);
    if (st != LOOM_OK) {
        loom_rt_executable_destroy(*exe);
        *exe = NULL;
        loom_ir_diag_set(d, st, "out of memory");
    }
    return st;
}
