/* loom-ir ops: every op of ops.def and what each layer does with it, found by asking the
 * layers: a few random one-op samples per dtype (ir/samples.h) go through the reference
 * interpreter, codegen's check (or, with --check, the JIT compiled and run against the
 * interpreter) and autograd's VJP probe; codegen names its 16-bit matmul paths. Nothing is
 * listed by hand, so the table cannot go stale. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "targets/targets.h"
#include "loom_ir_exec.h"

enum { SAMPLES = 3, VJP_SAMPLES = 8, NOTE_MAX = 640, N_DT = LOOM_IR_SAMPLE_N_DTYPES };

/* One layer's verdict on one op: the dtypes (bits over loom_ir_sample_dtypes) whose every
 * sample it handled, and the first failure. */
typedef struct verdict {
    uint32_t ok;
    char why[NOTE_MAX];
} verdict;

typedef struct op_row {
    uint32_t takes;
    verdict interp, jit;
    enum { VJP_NA, VJP_YES, VJP_NO, VJP_SOME } vjp;
    char vjp_why[NOTE_MAX];
} op_row;

typedef struct probe {
    loom_allocator a;
    loom_rt_pool *pool;
    loom_rt_device *dev;
    loom_rt_metrics metrics;
    bool check; /* compile and run the samples, not only codegen's check */
    uint64_t rng;
} probe;

static void note_failure(verdict *v, loom_dtype dt, const char *what, const char *msg) {
    if (!v->why[0])
        snprintf(v->why, sizeof v->why, "%s %s: %s", what, loom_dtype_name(dt), msg);
}

/* The interpreter's and codegen's verdicts on op in dtype bit t, over SAMPLES samples. */
static void probe_dtype(probe *p, loom_ir_op op, int t, op_row *r) {
    loom_dtype dt = loom_ir_sample_dtypes[t];
    bool interp_ok = true, jit_ok = true;
    for (int k = 0; k < SAMPLES; k++) {
        loom_ir_graph g;
        loom_ir_graph_init(&g, &p->a);
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        loom_ir_sample s;
        if (loom_ir_sample_build(&g, op, dt, true, &p->rng, &s, &d) != LOOM_OK) {
            note_failure(&r->interp, dt, "sampling", d.msg);
            interp_ok = jit_ok = false;
        } else {
            if (loom_tg_check_against_ref(&g, &s, &p->rng, NULL, p->dev, &p->metrics, &d) !=
                LOOM_OK) {
                note_failure(&r->interp, dt, "interpreter", d.msg);
                interp_ok = false;
            }
            loom_ir_diag_init(&d);
            loom_status st = p->check ? loom_tg_check_against_ref(&g, &s, &p->rng, p->pool, p->dev,
                                                                  &p->metrics, &d)
                                      : loom_tg_npu_supports(&g, &d);
            if (st != LOOM_OK) {
                note_failure(&r->jit, dt, p->check ? "JIT run" : "codegen", d.msg);
                jit_ok = false;
            }
        }
        loom_ir_graph_deinit(&g);
    }
    r->interp.ok |= interp_ok ? 1u << t : 0;
    r->jit.ok |= jit_ok ? 1u << t : 0;
}

/* Autograd's verdict, on samples in f32 (else the first float dtype the op takes). */
static void probe_vjp(probe *p, loom_ir_op op, op_row *r) {
    int t = -1;
    for (int i = N_DT - 1; i >= 0; i--)
        if ((r->takes >> i & 1) && loom_ir_dtype_is_float(loom_ir_sample_dtypes[i]))
            t = i;
    r->vjp = VJP_NA;
    if (t < 0)
        return;
    int yes = 0, no = 0;
    for (int k = 0; k < VJP_SAMPLES; k++) {
        loom_ir_graph g;
        loom_ir_graph_init(&g, &p->a);
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        loom_ir_sample s;
        bool applies = false;
        loom_status st =
            loom_ir_sample_build(&g, op, loom_ir_sample_dtypes[t], true, &p->rng, &s, &d);
        if (st == LOOM_OK)
            st = loom_fe_vjp_probe(&g, s.subject, &applies, &d);
        if (st != LOOM_OK) {
            no++;
            if (!r->vjp_why[0])
                snprintf(r->vjp_why, sizeof r->vjp_why, "%s", d.msg);
        } else if (applies) {
            yes++;
        }
        loom_ir_graph_deinit(&g);
    }
    r->vjp = no == 0 ? (yes ? VJP_YES : VJP_NA) : yes ? VJP_SOME : VJP_NO;
}

/* "any", "numeric", "float" or the dtypes, for a mask over loom_ir_sample_dtypes. */
static const char *dtypes_text(char *buf, size_t n, uint32_t mask) {
    uint32_t all = (1u << N_DT) - 1, floats = 0, bools = 0;
    for (int i = 0; i < N_DT; i++) {
        floats |= loom_ir_dtype_is_float(loom_ir_sample_dtypes[i]) ? 1u << i : 0;
        bools |= loom_ir_sample_dtypes[i] == LOOM_DTYPE_BOOL ? 1u << i : 0;
    }
    if (mask == all)
        return "any";
    if (mask == (all & ~bools))
        return "numeric";
    if (mask == floats)
        return "float";
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_DT && len < n; i++)
        if (mask >> i & 1)
            len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? "," : "",
                                    loom_dtype_name(loom_ir_sample_dtypes[i]));
    return len ? buf : "none";
}

static bool takes_16bit(uint32_t mask) {
    for (int i = 0; i < N_DT; i++)
        if ((mask >> i & 1) && loom_dtype_size(loom_ir_sample_dtypes[i]) == 2)
            return true;
    return false;
}

/* The 16-bit column: how op's bf16/f16 data is computed here (codegen.h: 16-bit floats are
 * computed in f32 and rounded after every node; matmuls by the paths codegen names; the
 * runtime stages an all-reduce's 16-bit values as f32). */
static void sixteen_text(char *buf, size_t n, loom_ir_op op, const op_row *r) {
    const char *how = "-";
    switch (loom_ir_op_table[op].kind) {
    case LOOM_IR_KIND_CONV: /* the matmuls' microkernels (codegen/lower_conv.c) */
    case LOOM_IR_KIND_CONTRACTION: {
        const char *bf = loom_cg_matmul16_path(LOOM_DTYPE_BF16);
        const char *f = loom_cg_matmul16_path(LOOM_DTYPE_F16);
        if (takes_16bit(r->takes & r->jit.ok)) {
            snprintf(buf, n, "bf16 %.*s, f16 %.*s", (int)strcspn(bf, ":"), bf, (int)strcspn(f, ":"),
                     f);
            return;
        }
        break;
    }
    case LOOM_IR_KIND_UNARY:
    case LOOM_IR_KIND_PREDICATE:
    case LOOM_IR_KIND_BINARY:
    case LOOM_IR_KIND_COMPARE:
    case LOOM_IR_KIND_CAST:
    case LOOM_IR_KIND_REDUCTION:
    case LOOM_IR_KIND_POOL:
    case LOOM_IR_KIND_SCATTER:
    case LOOM_IR_KIND_ATTENTION:
    case LOOM_IR_KIND_IOTA:
    case LOOM_IR_KIND_RAND: how = "f32 math"; break;
    case LOOM_IR_KIND_SOURCE:
    case LOOM_IR_KIND_SELECT:
    case LOOM_IR_KIND_BROADCAST:
    case LOOM_IR_KIND_RESHAPE:
    case LOOM_IR_KIND_TRANSPOSE:
    case LOOM_IR_KIND_SLICE:
    case LOOM_IR_KIND_PAD:
    case LOOM_IR_KIND_GATHER:
    case LOOM_IR_KIND_CONCAT: how = "moved as is"; break;
    case LOOM_IR_KIND_COLLECTIVE:
        how = op == LOOM_IR_OP_ALL_REDUCE ? "host, f32 sum" : "host, as is";
        break;
    case LOOM_IR_KIND_COUNT_: break;
    }
    snprintf(buf, n, "%s", takes_16bit(r->takes & r->jit.ok) ? how : "-");
}

/* The table's footnotes, numbered from 1 in the order the cells cite them. */
typedef struct footnotes {
    const char *text[3 * LOOM_IR_OP_COUNT_];
    int n;
} footnotes;

/* Adds a footnote; its number. */
static int cite(footnotes *f, const char *text) {
    f->text[f->n++] = text;
    return f->n;
}

/* A layer's column: "all", or the dtypes it handles and a footnote on the first failure. */
static void layer_text(char *buf, size_t n, const op_row *r, const verdict *v, footnotes *f) {
    char list[96];
    if (v->ok == r->takes)
        snprintf(buf, n, "all");
    else
        snprintf(buf, n, "%s [%d]", v->ok ? dtypes_text(list, sizeof list, v->ok) : "none",
                 cite(f, v->why));
}

static void print_json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void print_json_dtypes(uint32_t mask) {
    putchar('[');
    for (int i = 0, first = 1; i < N_DT; i++)
        if (mask >> i & 1) {
            printf("%s\"%s\"", first ? "" : ",", loom_dtype_name(loom_ir_sample_dtypes[i]));
            first = 0;
        }
    putchar(']');
}

static const char *const vjp_names[] = {"n/a", "yes", "no", "some"};

static void print_json(const op_row *rows, int first, int last, bool check) {
    printf("{\"jit_checked_by\":\"%s\",\"samples_per_dtype\":%d,\"matmul16\":{\"bf16\":",
           check ? "run" : "codegen", SAMPLES);
    print_json_string(loom_cg_matmul16_path(LOOM_DTYPE_BF16));
    printf(",\"f16\":");
    print_json_string(loom_cg_matmul16_path(LOOM_DTYPE_F16));
    printf(",\"amx_bf16\":");
    print_json_string(loom_cg_amx_missing() ? loom_cg_amx_missing() : "available");
    printf("},\"ops\":[");
    for (int op = first; op <= last; op++) {
        const op_row *r = &rows[op];
        const loom_ir_op_info *info = &loom_ir_op_table[op];
        char six[160];
        sixteen_text(six, sizeof six, (loom_ir_op)op, r);
        printf("%s\n{\"op\":\"%s\",\"kind\":\"%s\",\"arity\":%d,\"autocast\":\"%s\",\"takes\":",
               op > first ? "," : "", info->name, loom_ir_kind_name(info->kind), (int)info->arity,
               loom_ir_autocast_name(info->autocast));
        print_json_dtypes(r->takes);
        printf(",\"interpreter\":");
        print_json_dtypes(r->interp.ok);
        printf(",\"jit\":");
        print_json_dtypes(r->jit.ok);
        printf(",\"vjp\":\"%s\",\"sixteen_bit\":", vjp_names[r->vjp]);
        print_json_string(six);
        printf(",\"notes\":{\"interpreter\":");
        print_json_string(r->interp.why);
        printf(",\"jit\":");
        print_json_string(r->jit.why);
        printf(",\"vjp\":");
        print_json_string(r->vjp_why);
        printf("}}");
    }
    printf("\n]}\n");
}

static void print_table(const op_row *rows, int first, int last, bool check) {
    printf("%-18s %-12s %-8s %-8s %-18s %-18s %-8s %s\n", "op", "kind", "autocast", "takes",
           "interpreter", check ? "JIT (run)" : "JIT", "VJP", "16-bit");
    footnotes notes = {.n = 0};
    for (int op = first; op <= last; op++) {
        const op_row *r = &rows[op];
        const loom_ir_op_info *info = &loom_ir_op_table[op];
        char takes[96], in[128], jit[128], vjp[32], six[160];
        layer_text(in, sizeof in, r, &r->interp, &notes);
        layer_text(jit, sizeof jit, r, &r->jit, &notes);
        if (r->vjp == VJP_NO || r->vjp == VJP_SOME)
            snprintf(vjp, sizeof vjp, "%s [%d]", vjp_names[r->vjp], cite(&notes, r->vjp_why));
        else
            snprintf(vjp, sizeof vjp, "%s", r->vjp == VJP_YES ? "yes" : "-");
        sixteen_text(six, sizeof six, (loom_ir_op)op, r);
        printf("%-18s %-12s %-8s %-8s %-18s %-18s %-8s %s\n", info->name,
               loom_ir_kind_name(info->kind), loom_ir_autocast_name(info->autocast),
               dtypes_text(takes, sizeof takes, r->takes), in, jit, vjp, six);
    }
    printf("\ntakes: the dtypes the op accepts (any: %d dtypes; numeric: all but bool; float: "
           "f32, f64, bf16, f16).\n",
           N_DT);
    printf("interpreter, JIT: the dtypes whose %d random samples each %s (all: every dtype the "
           "op takes).\n",
           SAMPLES,
           check ? "ran through the interpreter, and were compiled, run and matched the "
                   "interpreter's results"
                 : "ran through the interpreter, and that codegen can lower (--check compiles "
                   "and runs them)");
    printf("VJP: loom_backward has a gradient rule (-: nothing to differentiate, the result or "
           "the operands not float).\n");
    printf("16-bit: how bf16/f16 data is computed; 16-bit matmuls on this CPU:\n");
    printf("  bf16: %s\n  f16:  %s\n  amx-bf16: %s\n", loom_cg_matmul16_path(LOOM_DTYPE_BF16),
           loom_cg_matmul16_path(LOOM_DTYPE_F16),
           loom_cg_amx_missing() ? loom_cg_amx_missing() : "available");
    if (notes.n)
        printf("\nNotes:\n");
    for (int i = 0; i < notes.n; i++)
        printf("  [%d] %s\n", i + 1, notes.text[i]);
}

int loom_ir_cmd_ops(const char *only, bool check, bool json) {
    int first = 0, last = LOOM_IR_OP_COUNT_ - 1;
    if (only) {
        first = last = (int)loom_ir_op_from_name(only, strlen(only));
        if (first == LOOM_IR_OP_COUNT_) {
            fprintf(stderr, "loom-ir ops: error: no op '%s' in ops.def\n", only);
            return 2;
        }
    }
    probe p = {.a = loom_allocator_system(), .check = check};
    loom_rt_metrics_init(&p.metrics);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    op_row *rows = calloc(LOOM_IR_OP_COUNT_, sizeof *rows);
    if (!rows || loom_rt_pool_create(loom_rt_default_threads(), &p.a, &p.pool) != LOOM_OK ||
        loom_rt_device_create("npu:0", &p.a, &p.metrics, &p.dev, &d) != LOOM_OK) {
        fprintf(stderr, "loom-ir ops: error: cannot start the runtime: %s\n",
                d.msg[0] ? d.msg : "out of memory");
        loom_rt_pool_destroy(p.pool);
        free(rows);
        return 1;
    }
    bool tty = isatty(2);
    int rc = 0;
    for (int op = first; op <= last; op++) {
        op_row *r = &rows[op];
        p.rng = 0x9e3779b97f4a7c15ull * (uint64_t)(op + 1); /* per op: --op NAME gives its row */
        if (check)
            fprintf(stderr, "%sloom-ir ops: checking %s (%d of %d)%s", tty ? "\r\033[K" : "",
                    loom_ir_op_name((loom_ir_op)op), op - first + 1, last - first + 1,
                    tty ? "" : "\n");
        for (int t = 0; t < N_DT; t++)
            if (loom_ir_op_accepts((loom_ir_op)op, loom_ir_sample_dtypes[t])) {
                r->takes |= 1u << t;
                probe_dtype(&p, (loom_ir_op)op, t, r);
            }
        p.rng = 0x2545f4914f6cdd1dull * (uint64_t)(op + 1); /* the same with and without --check */
        probe_vjp(&p, (loom_ir_op)op, r);
        if (check && r->jit.ok != r->takes)
            rc = 1;
    }
    if (check && tty)
        fputs("\r\033[K", stderr);
    if (json)
        print_json(rows, first, last, check);
    else
        print_table(rows, first, last, check);
    loom_rt_device_destroy(p.dev);
    loom_rt_pool_destroy(p.pool);
    free(rows);
    return rc;
}
