/* Executables: the common destroy entry point over each executable kind's vtable. */
#include "runtime.h"

void loom_rt_executable_destroy(loom_rt_executable *exe) {
    if (exe)
        exe->vt->destroy(exe);
}
