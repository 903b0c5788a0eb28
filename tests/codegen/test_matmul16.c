/* 16-bit (bf16, f16) matmul kernels on every path this CPU has (LOOM_MATMUL_ISA forces
 * each): against an f64 reference of the 16-bit inputs on odd and batched shapes, with
 * fused epilogues, and with the casts of f32 operands fused into the matmul's packing
 * against the unfused interpreter. Paths the CPU lacks are skipped, saying why. Also the
 * large f32 matmuls that share the 16-bit kinds' FMA microkernel on AVX-512 hosts. Every
 * input ends at a page with no access, so a kernel reading past an operand faults. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "test_util.h"

#include "codegen/codegen.h"
#include "passes/passes.h"
#include "runtime/runtime.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

static loom_allocator sys;
static const char *dump_dir; /* compile_and_run's dumps go here when set */

/* ---- paths -------------------------------------------------------------------------------- */

/* Whether the target key (the enabled host features) lists +feature. */
static bool host_has(const char *feature) {
    char want[64];
    snprintf(want, sizeof want, "+%s,", feature);
    return strstr(loom_cg_target_key(), want) != NULL;
}

typedef struct isa_path {
    const char *name; /* LOOM_MATMUL_ISA */
    const char *feature;
} isa_path;

static const isa_path paths[] = {
    {"avx512bf16", "avx512bf16"}, /* bf16 through vdpbf16ps; f16 converted to f32 */
    {"f32", NULL},                /* every machine: operands converted to f32 */
    {"avx2", NULL},               /* the same in AVX2's 6 x 16 C tiles (any host runs them) */
    {"avx512", NULL},             /* and in AVX-512's 8 x 32 or 16 x 16 */
};

/* Forces path p for the compiles that follow; false (after cmocka's skip message) when
 * the CPU cannot run it. */
static bool use_path(const isa_path *p) {
    if (p->feature && !host_has(p->feature)) {
        print_message("skipping LOOM_MATMUL_ISA=%s: this CPU has no %s\n", p->name, p->feature);
        return false;
    }
    setenv("LOOM_MATMUL_ISA", p->name, 1);
    return true;
}

/* ---- graphs, plans, runs ------------------------------------------------------------------ */

typedef struct case_io {
    void *in[64];
    void *out[64];
    void *in_map[64]; /* the inputs' mappings (guarded) and their lengths */
    size_t in_len[64];
} case_io;

/* A zeroed buffer of `bytes` that ends where a page with no access begins: a kernel that
 * reads past an input's end (JIT code, which ASan does not see) faults in the test. */
static void *guarded_alloc(size_t bytes, void **out_map, size_t *out_len) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), span = (bytes + page - 1) / page * page;
    *out_len = span + page;
    char *m = mmap(NULL, *out_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    assert_int_equal(mprotect(m + span, page, PROT_NONE), 0);
    *out_map = m;
    return m + span - bytes;
}

/* Random values in [-1, 1] for every graph input, stored in its dtype. */
static void fill_inputs(const loom_ir_graph *g, case_io *io, uint64_t seed) {
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (n->op != LOOM_IR_OP_INPUT)
            continue;
        int64_t count = loom_ir_numel(n->rank, n->shape), x = n->attrs.index;
        void *buf = guarded_alloc(tu_node_bytes(n), &io->in_map[x], &io->in_len[x]);
        for (int64_t e = 0; e < count; e++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            loom_ir_store_f64(buf, n->dtype, e, (double)(seed >> 11) / 4503599627370496.0 - 1.0);
        }
        io->in[n->attrs.index] = buf;
    }
    for (int32_t o = 0; o < g->n_outputs; o++)
        io->out[o] = calloc(tu_node_bytes(&g->nodes[g->outputs[o].node]) + 1, 1);
}

static void free_io(const loom_ir_graph *g, case_io *io) {
    for (int32_t i = 0; i < g->n_graph_inputs; i++)
        munmap(io->in_map[i], io->in_len[i]);
    for (int32_t o = 0; o < g->n_outputs; o++)
        free(io->out[o]);
}

/* Fuses g, compiles its plan and runs every kernel over its tasks in 3 calls. Every kernel
 * here reads graph inputs and writes graph outputs only. Returns the plan's kernel count. */
static int32_t compile_and_run(const loom_ir_graph *g, case_io *io) {
    loom_ir_plan plan;
    loom_ir_plan_init(&plan, &sys);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_pass_fuse(g, &plan, &d) != LOOM_OK || loom_pass_plan_memory(g, &plan, &d) != LOOM_OK ||
        loom_ir_plan_verify(&plan, g, &d) != LOOM_OK)
        fail_msg("plan: %s", d.msg);
    loom_rt_kernel *ks = calloc((size_t)plan.n_kernels + 1, sizeof *ks);
    loom_cg_code *code = NULL;
    loom_cg_options opts = {.compile_threads = 2, .dump_dir = dump_dir, .dump_prefix = "k"};
    if (loom_cg_compile(g, &plan, &opts, &code, ks, &d) != LOOM_OK)
        fail_msg("compile: %s", d.msg);
    for (int32_t k = 0; k < plan.n_kernels; k++) {
        const loom_ir_kernel *kr = &plan.kernels[k];
        void *bufs[64];
        assert_true(kr->n_args + kr->n_results <= 64);
        for (int32_t i = 0; i < kr->n_args; i++) {
            const loom_ir_node *a = &g->nodes[kr->args[i]];
            assert_int_equal(a->op, LOOM_IR_OP_INPUT);
            bufs[i] = io->in[a->attrs.index];
        }
        for (int32_t i = 0; i < kr->n_results; i++) {
            int32_t o = 0;
            while (o < g->n_outputs && g->outputs[o].node != kr->results[i])
                o++;
            assert_true(o < g->n_outputs);
            bufs[kr->n_args + i] = io->out[o];
        }
        for (int c = 0; c < 3; c++) {
            int64_t lo = ks[k].extent * c / 3, hi = ks[k].extent * (c + 1) / 3;
            if (lo < hi)
                ks[k].fn(bufs, lo, hi);
        }
    }
    int32_t n = plan.n_kernels;
    loom_cg_code_destroy(code);
    free(ks);
    loom_ir_plan_deinit(&plan);
    return n;
}

/* Unit roundoff of the result's dtype: 16-bit results are rounded once, from f32. */
static double unit_roundoff(loom_dtype dt) {
    return dt == LOOM_DTYPE_BF16 ? 0x1p-8 : dt == LOOM_DTYPE_F16 ? 0x1p-11 : 0x1p-24;
}

/* Checks out (the product of a and b, [P,M,N]) against an f64 sum of the inputs: within
 * one rounding to dt plus an f32 accumulation's error (K steps of 2^-24, on the sum
 * of |a||b|); every row_step-th row and the last. */
static void check_rows(loom_dtype dt, int64_t P, int64_t M, int64_t N, int64_t K, const void *a,
                       const void *b, const void *out, int64_t row_step, const char *what) {
    for (int64_t p = 0; p < P; p++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N && (i % row_step == 0 || i == M - 1); j++) {
                double ref = 0, mag = 0;
                for (int64_t k = 0; k < K; k++) {
                    double t = loom_ir_load_f64(a, dt, (p * M + i) * K + k) *
                               loom_ir_load_f64(b, dt, (p * K + k) * N + j);
                    ref += t;
                    mag += fabs(t);
                }
                double got = loom_ir_load_f64(out, dt, (p * M + i) * N + j);
                double tol =
                    unit_roundoff(dt) * fabs(ref) + 2.0 * (double)K * 0x1p-24 * mag + 1e-30;
                if (!(fabs(got - ref) <= tol))
                    fail_msg("%s: [%lld,%lld,%lld] = %.9g, want %.9g (tolerance %.3g)", what,
                             (long long)p, (long long)i, (long long)j, got, ref, tol);
            }
}

/* ---- products against f64 ------------------------------------------------------------------ */

typedef struct mm_shape {
    int64_t P, M, N, K;
} mm_shape;

/* Many independent matmuls in one graph (one compile): each its own kernel, checked on
 * every row_step-th row. */
static void check_shapes(loom_dtype dt, const mm_shape *shapes, int n, int64_t row_step,
                         const char *path) {
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    for (int s = 0; s < n; s++) {
        const mm_shape *sh = &shapes[s];
        bool batched = sh->P > 1;
        int32_t r = batched ? 3 : 2;
        int32_t a = tu_input(&g, dt, r, batched ? S(sh->P, sh->M, sh->K) : S(sh->M, sh->K));
        int32_t b = tu_input(&g, dt, r, batched ? S(sh->P, sh->K, sh->N) : S(sh->K, sh->N));
        int32_t m =
            tu_add(&g, LOOM_IR_OP_MATMUL, 2, (int32_t[]){a, b}, 0, 0, NULL, (loom_ir_attrs){0});
        tu_output(&g, m, -1);
    }
    case_io io = {0};
    fill_inputs(&g, &io, 7);
    assert_int_equal(compile_and_run(&g, &io), n);
    for (int s = 0; s < n; s++) {
        const mm_shape *sh = &shapes[s];
        char what[128];
        snprintf(what, sizeof what, "%s %s matmul P%lld M%lld N%lld K%lld", path,
                 loom_dtype_name(dt), (long long)sh->P, (long long)sh->M, (long long)sh->N,
                 (long long)sh->K);
        check_rows(dt, sh->P, sh->M, sh->N, sh->K, io.in[2 * s], io.in[2 * s + 1], io.out[s],
                   row_step, what);
    }
    free_io(&g, &io);
    loom_ir_graph_deinit(&g);
}

static void test_16_bit_matmuls_match_f64_on_odd_and_batched_shapes_on_each_path(void **state) {
    (void)state;
    /* M, N and K each take every value of odd[] (two Latin squares), plus larger blocks,
     * several tasks of rows and columns, and batches */
    static const int64_t odd[] = {1, 15, 17, 33, 65, 129};
    mm_shape shapes[40];
    int n = 0;
    for (int i = 0; i < 6; i++) {
        shapes[n++] = (mm_shape){1, odd[i], odd[(i + 1) % 6], odd[(i + 3) % 6]};
        shapes[n++] = (mm_shape){1, odd[i], odd[(i + 4) % 6], odd[(i + 2) % 6]};
        shapes[n++] = (mm_shape){1, odd[i], odd[i], odd[(i + 5) % 6]};
    }
    shapes[n++] = (mm_shape){1, 1, 1, 1};
    shapes[n++] = (mm_shape){1, 256, 200, 300};
    shapes[n++] = (mm_shape){1, 130, 520, 70};
    shapes[n++] = (mm_shape){1, 40, 4100, 9}; /* columns split across tasks */
    shapes[n++] = (mm_shape){3, 17, 33, 65};
    shapes[n++] = (mm_shape){2, 129, 15, 1};
    int ran = 0;
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (!use_path(&paths[p]))
            continue;
        check_shapes(LOOM_DTYPE_BF16, shapes, n, 1, paths[p].name);
        check_shapes(LOOM_DTYPE_F16, shapes, n, 1, paths[p].name);
        ran++;
    }
    unsetenv("LOOM_MATMUL_ISA");
    assert_true(ran >= 1); /* the f32 path runs everywhere */
}

static void test_amx_path_runs_where_the_cpu_has_amx(void **state) {
    (void)state;
    if (!host_has("amx-bf16")) {
        print_message("skipping: this CPU has no AMX-BF16\n");
        skip();
    }
    /* Loom has no AMX kernels yet: forcing amx must warn and fall back, never fault */
    setenv("LOOM_MATMUL_ISA", "amx", 1);
    mm_shape sh = {1, 33, 65, 17};
    check_shapes(LOOM_DTYPE_BF16, &sh, 1, 1, "amx (falls back to f32)");
    unsetenv("LOOM_MATMUL_ISA");
}

static void test_forcing_a_path_the_cpu_lacks_falls_back_to_f32(void **state) {
    (void)state;
    /* amx where there is none (or where Loom has no AMX kernel): a warning, the f32 path */
    setenv("LOOM_MATMUL_ISA", "amx", 1);
    mm_shape sh = {1, 17, 33, 15};
    check_shapes(LOOM_DTYPE_BF16, &sh, 1, 1, "amx forced");
    /* the forced path is part of the cache key: objects of one path never serve another */
    char key[8192];
    snprintf(key, sizeof key, "%s", loom_cg_target_key());
    assert_non_null(strstr(key, ";mm-amx"));
    setenv("LOOM_MATMUL_ISA", "f32", 1);
    assert_non_null(strstr(loom_cg_target_key(), ";mm-f32"));
    assert_string_not_equal(key, loom_cg_target_key());
    unsetenv("LOOM_MATMUL_ISA");
    assert_non_null(strstr(loom_cg_target_key(), ";mm-auto"));
}

/* ---- epilogues and fused casts ------------------------------------------------------------ */

/* Checks every output of g computed by compile_and_run against the interpreter, within two
 * roundings to dt plus f32 accumulation over K on operands of magnitude <= 1. */
static void check_against_interpreter(const loom_ir_graph *g, loom_dtype dt, int64_t K,
                                      int32_t want_kernels, const char *what) {
    case_io io = {0}, ref = {0};
    fill_inputs(g, &io, 11);
    fill_inputs(g, &ref, 11);
    assert_int_equal(compile_and_run(g, &io), want_kernels);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_rt_interp_run(g, &sys, (const void *const *)ref.in, ref.out, &d) != LOOM_OK)
        fail_msg("interp: %s", d.msg);
    for (int32_t o = 0; o < g->n_outputs; o++) {
        const loom_ir_node *n = &g->nodes[g->outputs[o].node];
        for (int64_t e = 0; e < loom_ir_numel(n->rank, n->shape); e++) {
            double got = loom_ir_load_f64(io.out[o], n->dtype, e);
            double want = loom_ir_load_f64(ref.out[o], n->dtype, e);
            double tol =
                2.0 * unit_roundoff(dt) * (fabs(want) + 1.0) + 2.0 * (double)K * 0x1p-24 * K;
            if (!(fabs(got - want) <= tol))
                fail_msg("%s: output %d [%lld] = %.9g, want %.9g", what, (int)o, (long long)e, got,
                         want);
        }
    }
    free_io(g, &io);
    free_io(g, &ref);
}

/* Builds a one-kernel case of dtype dt into g; returns its K. */
typedef int64_t (*build_fn)(loom_ir_graph *g, loom_dtype dt);

/* Runs the case built by build in bf16 and f16 on every path the CPU has. */
static void on_each_path(build_fn build, const char *name) {
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (!use_path(&paths[p]))
            continue;
        for (int t = 0; t < 2; t++) {
            loom_dtype dt = t ? LOOM_DTYPE_F16 : LOOM_DTYPE_BF16;
            loom_ir_graph g;
            loom_ir_graph_init(&g, &sys);
            int64_t K = build(&g, dt);
            char what[96];
            snprintf(what, sizeof what, "%s %s %s", paths[p].name, loom_dtype_name(dt), name);
            check_against_interpreter(&g, dt, K, 1, what);
            loom_ir_graph_deinit(&g);
        }
    }
    unsetenv("LOOM_MATMUL_ISA");
}

static int64_t build_bias_relu(loom_ir_graph *g, loom_dtype dt) {
    loom_ir_attrs none = {0};
    int32_t x = tu_input(g, dt, 2, S(33, 65));
    int32_t w = tu_input(g, dt, 2, S(65, 47));
    int32_t bias = tu_input(g, dt, 1, S(47));
    int32_t m = tu_add(g, LOOM_IR_OP_MATMUL, 2, (int32_t[]){x, w}, 0, 0, NULL, none);
    int32_t bb = tu_add(g, LOOM_IR_OP_BROADCAST, 1, &bias, 0, 2, S(33, 47), none);
    int32_t s = tu_add(g, LOOM_IR_OP_ADD, 2, (int32_t[]){m, bb}, 0, 0, NULL, none);
    tu_output(g, tu_add(g, LOOM_IR_OP_RELU, 1, &s, 0, 0, NULL, none), -1);
    return 65;
}

static void test_16_bit_matmuls_fuse_bias_and_relu_epilogues(void **state) {
    (void)state;
    on_each_path(build_bias_relu, "matmul + bias + relu");
}

/* autocast's linear: relu(cast(x) @ transpose(cast(W))), x and W in f32 */
static int64_t build_cast_linear(loom_ir_graph *g, loom_dtype dt) {
    loom_ir_attrs none = {0}, perm = {.perm = {1, 0}};
    int32_t x = tu_input(g, LOOM_DTYPE_F32, 2, S(70, 33));
    int32_t w = tu_input(g, LOOM_DTYPE_F32, 2, S(129, 33));
    int32_t xc = tu_add(g, LOOM_IR_OP_CAST, 1, &x, dt, 0, NULL, none);
    int32_t wc = tu_add(g, LOOM_IR_OP_CAST, 1, &w, dt, 0, NULL, none);
    int32_t wt = tu_add(g, LOOM_IR_OP_TRANSPOSE, 1, &wc, 0, 0, NULL, perm);
    int32_t m = tu_add(g, LOOM_IR_OP_MATMUL, 2, (int32_t[]){xc, wt}, 0, 0, NULL, none);
    tu_output(g, tu_add(g, LOOM_IR_OP_RELU, 1, &m, 0, 0, NULL, none), -1);
    return 33;
}

static void test_casts_into_a_16_bit_matmul_are_packed_in_its_kernel(void **state) {
    (void)state;
    /* one kernel (no pass writing a 16-bit copy), equal to the unfused interpreter */
    on_each_path(build_cast_linear, "cast-in-matmul");
}

/* x [m, k] @ transpose(y [n, k]) into g; returns the matmul's node and, in *out_yt, the
 * transpose's. */
static int32_t add_x_yt(loom_ir_graph *g, loom_dtype dt, int64_t m, int64_t n, int64_t k,
                        int32_t *out_yt) {
    loom_ir_attrs none = {0}, perm = {.perm = {1, 0}};
    int32_t x = tu_input(g, dt, 2, S(m, k));
    int32_t y = tu_input(g, dt, 2, S(n, k));
    int32_t yt = tu_add(g, LOOM_IR_OP_TRANSPOSE, 1, &y, 0, 0, NULL, perm);
    if (out_yt)
        *out_yt = yt;
    return tu_add(g, LOOM_IR_OP_MATMUL, 2, (int32_t[]){x, yt}, 0, 0, NULL, none);
}

/* a weight gradient's x @ transpose(dy): B packed along the rows of dy, K in several blocks
 * with a short last one and an odd tail, columns in two panels, the second partial */
static int64_t build_transposed_b(loom_ir_graph *g, loom_dtype dt) {
    tu_output(g, add_x_yt(g, dt, 37, 29, 301, NULL), -1);
    return 301;
}

static void test_a_transposed_b_is_packed_along_its_rows(void **state) {
    (void)state;
    on_each_path(build_transposed_b, "x @ transpose(dy)");
}

/* K above 4096 runs in chunks of 512 (lower_matmul.c): full chunks, a short last one and,
 * for bf16 pairs, an odd last element; batched; B transposed. */
static void test_long_k_16_bit_matmuls_run_in_chunks(void **state) {
    (void)state;
    static const mm_shape shapes[] = {
        {1, 33, 40, 5121}, /* 10 chunks and one element */
        {2, 17, 65, 4500}, /* 8 chunks and 404 */
        {1, 70, 129, 4097},
    };
    int ran = 0;
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (!use_path(&paths[p]))
            continue;
        check_shapes(LOOM_DTYPE_BF16, shapes, 3, 1, paths[p].name);
        check_shapes(LOOM_DTYPE_F16, shapes, 1, 1, paths[p].name);
        ran++;
    }
    unsetenv("LOOM_MATMUL_ISA");
    assert_true(ran >= 1);
}

/* GPT-2's tied lm_head in backward: dy [R, V] @ wte [V, C] with K = V long, and x @ dy^T */
static int64_t build_transposed_b_long_k(loom_ir_graph *g, loom_dtype dt) {
    tu_output(g, add_x_yt(g, dt, 37, 29, 4609, NULL), -1);
    return 4609;
}

static void test_a_transposed_b_with_a_long_k_is_packed_chunk_by_chunk(void **state) {
    (void)state;
    on_each_path(build_transposed_b_long_k, "x @ transpose(dy), K 4609");
}

/* Operands packed straight from their buffers (lower_matmul.c's pack_direct) in each
 * orientation: A and B each as stored or transposed (a weight gradient's dy^T @ x, the
 * lm_head's x @ wte^T), cast from f32 or not, batched; the shapes leave partial 16 x 16
 * blocks on every side and an odd K (a bf16 pair's tail), or (bit 4) none at all. tr: bit 0
 * A, bit 1 B; bit 2: operands f32, cast in the kernel; bit 3: a batch of 2. */
static int64_t build_orientation(loom_ir_graph *g, loom_dtype dt, int tr) {
    loom_ir_attrs none = {0}, perm2 = {.perm = {1, 0}}, perm3 = {.perm = {0, 2, 1}};
    const bool whole = tr & 16;
    const int64_t M = whole ? 64 : 37, N = whole ? 48 : 45, K = whole ? 96 : 301, P = 2;
    bool batched = tr & 8, cast = tr & 4;
    int32_t r = batched ? 3 : 2, ops[2];
    for (int q = 0; q < 2; q++) {
        bool t = tr & (1 << q);
        int64_t rows = q == 0 ? (t ? K : M) : (t ? N : K), cols = q == 0 ? (t ? M : K) : (t ? K : N);
        int32_t x = tu_input(g, cast ? LOOM_DTYPE_F32 : dt, r,
                             batched ? S(P, rows, cols) : S(rows, cols));
        if (cast)
            x = tu_add(g, LOOM_IR_OP_CAST, 1, &x, dt, 0, NULL, none);
        if (t)
            x = tu_add(g, LOOM_IR_OP_TRANSPOSE, 1, &x, 0, 0, NULL, batched ? perm3 : perm2);
        ops[q] = x;
    }
    tu_output(g, tu_add(g, LOOM_IR_OP_MATMUL, 2, ops, 0, 0, NULL, none), -1);
    return K;
}

#define ORIENTATION(tr)                                                                            \
    static int64_t build_orientation_##tr(loom_ir_graph *g, loom_dtype dt) {                       \
        return build_orientation(g, dt, tr);                                                       \
    }
ORIENTATION(1)
ORIENTATION(3)
ORIENTATION(5)
ORIENTATION(6)
ORIENTATION(11)
ORIENTATION(12)
ORIENTATION(19)
ORIENTATION(22)
#undef ORIENTATION

static void test_operands_pack_from_their_buffers_in_every_orientation(void **state) {
    (void)state;
    on_each_path(build_orientation_1, "transpose(a) @ b");
    on_each_path(build_orientation_3, "transpose(a) @ transpose(b)");
    on_each_path(build_orientation_5, "transpose(cast(a)) @ cast(b)");
    on_each_path(build_orientation_6, "cast(a) @ transpose(cast(b))");
    on_each_path(build_orientation_11, "batched transpose(a) @ transpose(b)");
    on_each_path(build_orientation_12, "batched cast(a) @ cast(b)");
    on_each_path(build_orientation_19, "transpose(a) @ transpose(b), whole blocks");
    on_each_path(build_orientation_22, "cast(a) @ transpose(cast(b)), whole blocks");
}

/* ---- large f32 matmuls --------------------------------------------------------------------- */

/* Whether the kernel compile_and_run dumped to dir/k.mlir holds needle. */
static bool dump_holds(const char *dir, const char *needle) {
    char path[256];
    snprintf(path, sizeof path, "%s/k.mlir", dir);
    char *text = tu_read_file(path);
    assert_non_null(text);
    bool holds = strstr(text, needle) != NULL;
    free(text);
    return holds;
}

/* A large f32 matmul (K x N >= 2^20, M x K x N >= 2^29, M >= 256) runs on the packed FMA
 * microkernel on AVX-512 and AVX2 hosts (lower_matmul.c; its MLIR multiplies with math.fma
 * and has no linalg.matmul), in the host's C tiles or those LOOM_MATMUL_ISA=avx512 (8 x 32)
 * or avx2 (6 x 16) forces, and on the matmul schedule when LOOM_MATMUL_ISA forces the generic
 * tiles; all against f64, with a partial last panel of columns (N = 1025) and one more row
 * than the tiles hold (M = 513, not a multiple of 6 either). One with 511 rows stays on the
 * schedule. */
static void test_large_f32_matmuls_run_on_the_fma_microkernel(void **state) {
    (void)state;
    char dir[] = "/tmp/loom_mm16_XXXXXX";
    assert_non_null(mkdtemp(dir));
    dump_dir = dir;
    /* long: K = 8193 in 16 chunks of 512 and one element, on the microkernel */
    const mm_shape big = {1, 513, 1025, 1024}, fewer = {1, 511, 1025, 1024},
                   long_k = {1, 256, 256, 8193};
    struct {
        const char *isa; /* LOOM_MATMUL_ISA, NULL: unset */
        const mm_shape *sh;
        bool microkernel;
    } cases[] = {
        {NULL, &big, true},      {"avx512", &big, true},   {"avx2", &big, true},
        {"avx2", &long_k, true}, {"generic", &big, false}, {NULL, &fewer, false},
        {NULL, &long_k, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].microkernel && !host_has("avx512f") && !host_has("avx2")) {
            print_message("skipping the microkernel case: this CPU has neither AVX-512 nor AVX2\n");
            continue;
        }
        if (cases[i].isa)
            setenv("LOOM_MATMUL_ISA", cases[i].isa, 1);
        else
            unsetenv("LOOM_MATMUL_ISA");
        char what[64];
        snprintf(what, sizeof what, "f32 %lld rows, LOOM_MATMUL_ISA=%s", (long long)cases[i].sh->M,
                 cases[i].isa ? cases[i].isa : "(unset)");
        check_shapes(LOOM_DTYPE_F32, cases[i].sh, 1, 7, what);
        if (dump_holds(dir, "math.fma") != cases[i].microkernel ||
            dump_holds(dir, "linalg.matmul") == cases[i].microkernel)
            fail_msg("%s: expected the %s", what,
                     cases[i].microkernel ? "FMA microkernel" : "matmul schedule");
    }
    unsetenv("LOOM_MATMUL_ISA");
    dump_dir = NULL;
    static const char *const ext[] = {".mlir", ".lowered.mlir", ".m0.ll", ".m0.s"};
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/k%s", dir, ext[i]);
        unlink(path);
    }
    assert_int_equal(rmdir(dir), 0);
}

/* x @ transpose(W) in f32 for a W of 2^20 elements or more and 64 rows or more, or of 2^16
 * elements or more and 256 rows or more (a GPT-2 layer's W^T): the transpose joins the
 * matmul's kernel (loom_ir_matmul_operand_fuses) and is packed along W's rows, on the
 * AVX-512 tiles and on the AVX2 ones; with 63 rows, a W of 2^20 - 1 elements at 70 rows,
 * 255 rows of a W of 2^16 elements or a W of 2^16 - 256 at 256 rows, it stays an operand
 * read from a buffer. */
static void test_an_f32_matmul_packs_a_large_transposed_weight_in_its_kernel(void **state) {
    (void)state;
    static const struct {
        int64_t rows;
        int32_t kernels;
        const char *isa;
    } cases[] = {{70, 1, NULL}, {70, 1, "avx2"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (!cases[i].isa && !host_has("avx512f")) {
            print_message("running the AVX-512 case on this CPU's own tiles (no AVX-512)\n");
        }
        if (cases[i].isa)
            setenv("LOOM_MATMUL_ISA", cases[i].isa, 1);
        else
            unsetenv("LOOM_MATMUL_ISA");
        loom_ir_graph g;
        loom_ir_graph_init(&g, &sys);
        /* W [4099, 256]: 1049344 elements */
        tu_output(&g, add_x_yt(&g, LOOM_DTYPE_F32, cases[i].rows, 4099, 256, NULL), -1);
        char what[96];
        snprintf(what, sizeof what, "f32 x [%lld, 256] @ W^T [256, 4099], LOOM_MATMUL_ISA=%s",
                 (long long)cases[i].rows, cases[i].isa ? cases[i].isa : "(unset)");
        check_against_interpreter(&g, LOOM_DTYPE_F32, 256, cases[i].kernels, what);
        loom_ir_graph_deinit(&g);
    }
    unsetenv("LOOM_MATMUL_ISA");
    /* a weight gradient's dy^T @ x with dy [256, 4099]: A transposed, packed from dy's rows */
    loom_ir_graph ga;
    loom_ir_graph_init(&ga, &sys);
    loom_ir_attrs none = {0}, perm = {.perm = {1, 0}};
    int32_t dy = tu_input(&ga, LOOM_DTYPE_F32, 2, S(256, 4099));
    int32_t x = tu_input(&ga, LOOM_DTYPE_F32, 2, S(256, 70));
    int32_t dyt = tu_add(&ga, LOOM_IR_OP_TRANSPOSE, 1, &dy, 0, 0, NULL, perm);
    tu_output(&ga, tu_add(&ga, LOOM_IR_OP_MATMUL, 2, (int32_t[]){dyt, x}, 0, 0, NULL, none), -1);
    check_against_interpreter(&ga, LOOM_DTYPE_F32, 256, 1, "f32 dy^T [4099, 256] @ x [256, 70]");
    loom_ir_graph_deinit(&ga);
    loom_ir_graph gl; /* a layer's x [256, 256] @ W^T with W [768, 256] */
    loom_ir_graph_init(&gl, &sys);
    tu_output(&gl, add_x_yt(&gl, LOOM_DTYPE_F32, 256, 768, 256, NULL), -1);
    check_against_interpreter(&gl, LOOM_DTYPE_F32, 256, 1, "f32 x [256, 256] @ W^T [256, 768]");
    loom_ir_graph_deinit(&gl);
    const int64_t small[4][3] = {
        {63, 4099, 256}, {70, 4095, 256}, {255, 256, 256}, {256, 255, 256}};
    for (int i = 0; i < 4; i++) { /* rows, W's shape */
        loom_ir_graph g;
        loom_ir_graph_init(&g, &sys);
        int32_t wt;
        int32_t m = add_x_yt(&g, LOOM_DTYPE_F32, small[i][0], small[i][1], small[i][2], &wt);
        assert_false(loom_ir_matmul_operand_fuses(&g, m, wt));
        loom_ir_graph_deinit(&g);
    }
}

int main(void) {
    sys = loom_allocator_system();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_16_bit_matmuls_match_f64_on_odd_and_batched_shapes_on_each_path),
        cmocka_unit_test(test_amx_path_runs_where_the_cpu_has_amx),
        cmocka_unit_test(test_forcing_a_path_the_cpu_lacks_falls_back_to_f32),
        cmocka_unit_test(test_16_bit_matmuls_fuse_bias_and_relu_epilogues),
        cmocka_unit_test(test_casts_into_a_16_bit_matmul_are_packed_in_its_kernel),
        cmocka_unit_test(test_a_transposed_b_is_packed_along_its_rows),
        cmocka_unit_test(test_long_k_16_bit_matmuls_run_in_chunks),
        cmocka_unit_test(test_a_transposed_b_with_a_long_k_is_packed_chunk_by_chunk),
        cmocka_unit_test(test_operands_pack_from_their_buffers_in_every_orientation),
        cmocka_unit_test(test_large_f32_matmuls_run_on_the_fma_microkernel),
        cmocka_unit_test(test_an_f32_matmul_packs_a_large_transposed_weight_in_its_kernel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
