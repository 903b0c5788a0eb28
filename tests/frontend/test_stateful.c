/* The stateful differential check (stateful_program.h) on a fixed budget of seeds: each
 * random program runs STEPS steps on the JIT and on the reference interpreter, its state
 * carried in place, and every state tensor and output must agree after every step. */
#include <stdio.h>
#include <stdlib.h>

#include "stateful_program.h"
#include "test_util.h"

enum { PROGRAMS = 48, STEPS = 4 };

/* Plays program `seed` (with poison, on LOOM_POISON's filled memory); fails the test with
 * the program's text on a difference. */
static void check_seed(uint64_t seed, bool poison, int32_t *out_steps_with_partial_reads) {
    sp_source src;
    sp_source_from_seed(&src, seed);
    sp_program p;
    sp_generate(&p, &src);
    sp_run jit, ref;
    assert_int_equal(sp_run_init(&jit, &p, false, poison), LOOM_OK);
    assert_int_equal(sp_run_init(&ref, &p, true, poison), LOOM_OK);
    static char text[8192], msg[512];
    for (int64_t step = 0; step < STEPS; step++) {
        loom_status a = sp_run_step(&jit, &p, step), b = sp_run_step(&ref, &p, step);
        if (a != LOOM_OK || b != LOOM_OK || !sp_compare(&jit, &ref, &p, msg, sizeof msg)) {
            if (a != LOOM_OK || b != LOOM_OK)
                snprintf(msg, sizeof msg, "the step failed: %s / %s",
                         loom_context_error_message(jit.ctx), loom_context_error_message(ref.ctx));
            sp_print(&p, text, sizeof text);
            fail_msg("seed %llu%s, step %lld: %s\n%s", (unsigned long long)seed,
                     poison ? " (LOOM_POISON)" : "", (long long)step, msg, text);
        }
    }
    for (int32_t i = 0; i < p.n_instr; i++)
        if (p.instr[i].kind == SP_READ) {
            (*out_steps_with_partial_reads)++;
            break;
        }
    sp_run_deinit(&jit);
    sp_run_deinit(&ref);
}

static void test_random_stateful_programs_match_the_interpreter_at_every_step(void **state) {
    (void)state;
    int32_t partial = 0;
    for (uint64_t seed = 1; seed <= PROGRAMS; seed++)
        check_seed(seed, false, &partial);
    print_message("# %d programs of %d steps; %d with a read in the middle of a step\n", PROGRAMS,
                  STEPS, (int)partial);
    assert_true(partial > 0); /* the budget exercises partial computes too */
}

/* The same on poisoned memory (LOOM_POISON): a kernel that reads scratch or an output it
 * did not write this step, or a freed buffer, sees NaN rather than the last step's values,
 * which the caching allocator would otherwise hand it. */
static void test_random_stateful_programs_match_on_poisoned_memory(void **state) {
    (void)state;
    int32_t partial = 0;
    for (uint64_t seed = 1; seed <= PROGRAMS; seed++)
        check_seed(seed, true, &partial);
}

/* The generator's reach: across the budget, every kind of instruction appears, and some
 * program reads a state tensor's old value through a view after assigning it. */
static void test_the_seed_budget_covers_every_kind_of_instruction(void **state) {
    (void)state;
    int32_t seen[SP_KIND_COUNT_] = {0}, old_reads = 0;
    for (uint64_t seed = 1; seed <= PROGRAMS; seed++) {
        sp_source src;
        sp_source_from_seed(&src, seed);
        sp_program p;
        sp_generate(&p, &src);
        /* value v derives from state k's old value when its chain starts at k before k's
         * assignment; count programs that use such a value after that assignment */
        int32_t origin[SP_MAX_VALUES], assigned_at[SP_MAX_STATE];
        for (int32_t k = 0; k < SP_MAX_STATE; k++)
            assigned_at[k] = -1;
        for (int32_t v = 0; v < p.n_state; v++)
            origin[v] = v;
        bool old_read = false;
        for (int32_t i = 0, v = p.n_state; i < p.n_instr; i++) {
            const sp_instr *in = &p.instr[i];
            seen[in->kind]++;
            int32_t o = in->a >= 0 && in->a < p.n_state ? in->a : in->a >= 0 ? origin[in->a] : -1;
            if (o >= 0 && assigned_at[o] >= 0 && in->a >= p.n_state && origin[in->a] == o &&
                in->a < assigned_at[o])
                old_read = true;
            if (in->kind == SP_ASSIGN) {
                assigned_at[in->k] = v;
                origin[v++] = -1;
            } else if (in->kind != SP_RETAIN && in->kind != SP_READ) {
                origin[v++] = o;
            }
        }
        old_reads += old_read;
    }
    for (int32_t k = 0; k < SP_KIND_COUNT_; k++)
        if (seen[k] == 0)
            fail_msg("no program of the budget has an instruction of kind %d", (int)k);
    assert_true(old_reads > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_seed_budget_covers_every_kind_of_instruction),
        cmocka_unit_test(test_random_stateful_programs_match_the_interpreter_at_every_step),
        cmocka_unit_test(test_random_stateful_programs_match_on_poisoned_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
