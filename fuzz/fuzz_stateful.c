/* libFuzzer target for compiled steps that run many times (tests/frontend/stateful_program.h):
 * the input's bytes choose a random stateful program (state tensors updated in place, read
 * through views, before and after their update, outputs, reads in the middle of a step),
 * which runs STEPS steps on the JIT and on the reference interpreter; every state tensor and
 * output must agree after every step. A difference, or a step that fails on one side only,
 * aborts with the program's text. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "stateful_program.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { STEPS = 4 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    sp_source src;
    sp_source_from_bytes(&src, data, size);
    sp_program p;
    sp_generate(&p, &src);
    sp_run jit, ref;
    static char text[8192], msg[512];
    if (sp_run_init(&jit, &p, false, false) != LOOM_OK ||
        sp_run_init(&ref, &p, true, false) != LOOM_OK) {
        fprintf(stderr, "fuzz_stateful: cannot create the contexts\n");
        abort();
    }
    for (int64_t step = 0; step < STEPS; step++) {
        loom_status a = sp_run_step(&jit, &p, step), b = sp_run_step(&ref, &p, step);
        bool same = a == b && (a != LOOM_OK || sp_compare(&jit, &ref, &p, msg, sizeof msg));
        if (!same) {
            if (a != b)
                snprintf(msg, sizeof msg, "the JIT's step says %s (%s), the interpreter's %s (%s)",
                         loom_status_name(a), loom_context_error_message(jit.ctx),
                         loom_status_name(b), loom_context_error_message(ref.ctx));
            sp_print(&p, text, sizeof text);
            fprintf(stderr, "fuzz_stateful: step %lld: %s\n%s\n", (long long)step, msg, text);
            abort();
        }
        if (a != LOOM_OK)
            break;
    }
    sp_run_deinit(&jit);
    sp_run_deinit(&ref);
    return 0;
}
