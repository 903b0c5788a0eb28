/* loom-ir compile and run (loom_ir_exec.c), ops (loom_ir_ops.c). */
#ifndef LOOM_TOOLS_LOOM_IR_EXEC_H
#define LOOM_TOOLS_LOOM_IR_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ir/ir.h"

/* Compiles g as a step would and prints what --emit names (mlir, lowered, llvm, asm, plan,
 * summary; LLVM IR and assembly one module after another, each under a comment naming it).
 * shown: the file's name for messages. Returns the exit status: 0, 1 (the pipeline failed),
 * 2 (an unknown --emit). */
int loom_ir_cmd_compile(const loom_ir_graph *g, const char *shown, const char *emit);

/* Compiles g, runs it repeat (>= 1) times on random inputs from seed and prints the median,
 * min and max run time, the compile time and the kernels by time (the LOOM_PROFILE table);
 * with check_interp, first compares the outputs with the reference interpreter's (exit 1
 * when they differ beyond float tolerance). Returns the exit status. */
int loom_ir_cmd_run(const loom_ir_graph *g, const char *shown, int repeat, bool check_interp,
                    uint64_t seed);

/* Prints every op of ops.def (only: just that one) with what each layer does with it: the
 * dtypes it takes, those the interpreter runs and codegen lowers (check: compiled, run and
 * matched against the interpreter), whether it has a VJP, how 16-bit data is computed;
 * json: as one JSON object. Returns the exit status: 0; 1 when a --check differs or the
 * runtime cannot start; 2 for an unknown op. */
int loom_ir_cmd_ops(const char *only, bool check, bool json);

/* loom-ir compare (loom_ir_compare.c): msProbe's pass rules. A tensor fails when cosine < cos
 * and max abs > abs, or cosine < cos_fail, or max abs > abs_fail; a name in one file only,
 * or two shapes, fail too. */
typedef struct loom_ir_compare_rules {
    double cos, abs, cos_fail, abs_fail;
} loom_ir_compare_rules;
#define LOOM_IR_COMPARE_RULES_DEFAULT {0.99, 0.001, 0.9, 1.0}
/* Sets the rules "cos=0.99,abs=1e-3,cos_fail=0.9,abs_fail=1" names; false with err on a bad
 * item. */
bool loom_ir_compare_rules_parse(const char *s, loom_ir_compare_rules *r, char *err,
                                 size_t err_size);
/* Compares dump A with dump B (safetensors files) tensor by tensor, in A's order, and prints
 * the table (json: one JSON object instead); html: also that file, a sortable page. Returns
 * the exit status: 0 all pass, 1 one fails, 2 a file is unreadable or invalid. */
int loom_ir_cmd_compare(const char *a, const char *b, const loom_ir_compare_rules *rules,
                        bool json, const char *html);

#endif
