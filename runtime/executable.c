/* Executables: the common destroy entry point over each executable kind's vtable. */
#include <string.h>

#include "runtime.h"

void loom_rt_executable_destroy(loom_rt_executable *exe) {
    if (!exe)
        return;
    if (exe->memory_report) {
        loom_allocator a = exe->alloc;
        loom_ir_free(&a, exe->memory_report, strlen(exe->memory_report) + 1);
    }
    exe->vt->destroy(exe);
}
