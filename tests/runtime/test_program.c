/* Tests of program executables: hand-written kernels with the kernel ABI over hand-built
 * graphs and plans, run on the NPU device: values, arena offsets, copies, donation, arena
 * reuse, bad plans and buffers, out-of-memory, perf maps and jitdumps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/kernel.h"
#include "test_util.h"

static loom_allocator sys;

#define S(...) ((const int64_t[]){__VA_ARGS__})
#define IDS(...) ((const int32_t[]){__VA_ARGS__}), (int32_t)(sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t))

/* ---- kernels: rows of 3 f32 values, [lo, hi) over rows ------------------------------------ */

enum { COLS = 3, MAX_KERNELS = 4 };

/* The bufs each kernel saw (recorded by the chunk starting at row 0: one writer). */
static void *seen_bufs[MAX_KERNELS][4];

static void record(int k, void *const *bufs, int n, int64_t lo) {
    if (lo == 0)
        for (int i = 0; i < n; i++)
            seen_bufs[k][i] = bufs[i];
}

static void add_rows(void *const *bufs, int64_t lo, int64_t hi) {
    record(0, bufs, 3, lo);
    const float *x = bufs[0], *y = bufs[1];
    float *z = bufs[2];
    for (int64_t i = lo * COLS; i < hi * COLS; i++)
        z[i] = x[i] + y[i];
}

static void mul_rows(void *const *bufs, int64_t lo, int64_t hi) {
    record(1, bufs, 3, lo);
    const float *x = bufs[0], *y = bufs[1];
    float *z = bufs[2];
    for (int64_t i = lo * COLS; i < hi * COLS; i++)
        z[i] = x[i] * y[i];
}

static void sub_rows(void *const *bufs, int64_t lo, int64_t hi) {
    record(2, bufs, 3, lo);
    const float *x = bufs[0], *y = bufs[1];
    float *z = bufs[2];
    for (int64_t i = lo * COLS; i < hi * COLS; i++)
        z[i] = x[i] - y[i];
}

static void neg_all(void *const *bufs, int64_t lo, int64_t hi) {
    record(0, bufs, 2, lo);
    const float *x = bufs[0];
    float *z = bufs[1];
    for (int64_t i = lo; i < hi; i++)
        z[i] = -x[i];
}

/* ---- code owner --------------------------------------------------------------------------- */

static int released;
static void release_code(void *owner) {
    assert_ptr_equal(owner, &released);
    released++;
}

/* ---- graph and plan builders -------------------------------------------------------------- */

static int32_t add_node(loom_ir_graph *g, loom_ir_op op, const int32_t *ins, int32_t n_ins,
                        int32_t rank, const int64_t *shape, int64_t index) {
    loom_ir_node_desc desc = {.op = op, .n_inputs = n_ins, .inputs = ins, .dtype = LOOM_DTYPE_F32,
                              .rank = rank, .shape = shape, .attrs = {.index = index}};
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    int32_t id = -1;
    if (loom_ir_graph_add(g, &desc, &id, &d) != LOOM_OK)
        fail_msg("graph_add %s: %s", loom_ir_op_name(op), d.msg);
    return id;
}

static int32_t *arena_ids(loom_ir_plan *p, const int32_t *ids, int32_t n) {
    int32_t *out = loom_ir_arena_alloc(&p->arena, (size_t)(n > 0 ? n : 1) * sizeof *out);
    assert_non_null(out);
    if (n > 0)
        memcpy(out, ids, (size_t)n * sizeof *out);
    return out;
}

static void add_kernel(loom_ir_plan *p, int32_t root, const int32_t *nodes, int32_t n_nodes,
                       const int32_t *args, int32_t n_args, const int32_t *results,
                       int32_t n_results) {
    assert_true(loom_ir_grow(&p->alloc, (void **)&p->kernels, &p->cap_kernels, p->n_kernels + 1,
                             sizeof *p->kernels));
    p->kernels[p->n_kernels] = (loom_ir_kernel){
        .kind = LOOM_IR_KERNEL_ELEMENTWISE, .root = root,
        .n_nodes = n_nodes, .nodes = arena_ids(p, nodes, n_nodes),
        .n_args = n_args, .args = arena_ids(p, args, n_args),
        .n_results = n_results, .results = arena_ids(p, results, n_results)};
    for (int32_t i = 0; i < n_nodes; i++)
        p->node_kernel[nodes[i]] = p->n_kernels;
    p->n_kernels++;
}

static void place(loom_ir_plan *p, int32_t node, loom_ir_buffer_kind kind, int32_t index,
                  size_t offset, size_t bytes) {
    p->placement[node] = (loom_ir_placement){.kind = kind, .index = index, .offset = offset,
                                             .bytes = bytes};
    p->has_placement[node] = true;
}

static void add_copy(loom_ir_plan *p, int32_t node, int32_t output) {
    assert_true(loom_ir_grow(&p->alloc, (void **)&p->copies, &p->cap_copies, p->n_copies + 1,
                             sizeof *p->copies));
    p->copies[p->n_copies++] = (loom_ir_copy){.node = node, .output = output};
}

/* The step used by most tests, over f32[4,3] a (input 0) and b (input 1):
 *   %2 = add a, b      kernel 0 -> arena offset 0
 *   %3 = mul %2, b     kernel 1 -> output 0
 *   %4 = sub %3, a     kernel 2 -> arena offset 64, copied to output 1, which is donated
 *                                  into a's buffer (so kernel 2 must still read the old a)
 * outputs: %3, %4 {alias = 0}, %2 (copied from the arena), b (copied from input 1). */
static void build_step(loom_ir_graph *g, loom_ir_plan *p, const loom_allocator *a) {
    loom_ir_graph_init(g, a);
    int32_t x = add_node(g, LOOM_IR_OP_INPUT, NULL, 0, 2, S(4, 3), 0);
    int32_t y = add_node(g, LOOM_IR_OP_INPUT, NULL, 0, 2, S(4, 3), 1);
    int32_t s = add_node(g, LOOM_IR_OP_ADD, IDS(x, y), 0, NULL, 0);
    int32_t m = add_node(g, LOOM_IR_OP_MUL, IDS(s, y), 0, NULL, 0);
    int32_t r = add_node(g, LOOM_IR_OP_SUB, IDS(m, x), 0, NULL, 0);
    assert_int_equal(loom_ir_graph_add_output(g, m, -1), LOOM_OK);
    assert_int_equal(loom_ir_graph_add_output(g, r, 0), LOOM_OK);
    assert_int_equal(loom_ir_graph_add_output(g, s, -1), LOOM_OK);
    assert_int_equal(loom_ir_graph_add_output(g, y, -1), LOOM_OK);

    loom_ir_plan_init(p, a);
    assert_int_equal(loom_ir_plan_reset(p, g), LOOM_OK);
    add_kernel(p, s, IDS(s), IDS(x, y), IDS(s));
    add_kernel(p, m, IDS(m), IDS(s, y), IDS(m));
    add_kernel(p, r, IDS(r), IDS(m, x), IDS(r));
    place(p, x, LOOM_IR_BUFFER_INPUT, 0, 0, 48);
    place(p, y, LOOM_IR_BUFFER_INPUT, 1, 0, 48);
    place(p, s, LOOM_IR_BUFFER_ARENA, 0, 0, 48);
    place(p, m, LOOM_IR_BUFFER_OUTPUT, 0, 0, 48);
    place(p, r, LOOM_IR_BUFFER_ARENA, 0, 64, 48);
    add_copy(p, r, 1);
    add_copy(p, s, 2);
    add_copy(p, y, 3);
    p->arena_bytes = 128;
}

static const loom_rt_kernel step_kernels[] = {
    {add_rows, 4, 1, 0},
    {mul_rows, 4, 1, 0},
    {sub_rows, 4, 1, 0},
};

static loom_rt_device *make_device(const loom_allocator *a) {
    loom_rt_device *dev = NULL;
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_device_create("npu:0", a, NULL, &dev, &d), LOOM_OK);
    return dev;
}

static loom_rt_buffer *make_buffer(loom_rt_device *dev, size_t size, const float *init) {
    loom_rt_buffer *b = NULL;
    assert_int_equal(loom_rt_buffer_alloc(dev, size, &b), LOOM_OK);
    if (init)
        memcpy(b->data, init, size);
    else
        memset(b->data, 0xff, size); /* NaN: a value the program forgot to write shows */
    return b;
}

static void assert_floats(const float *got, const float *want, int n) {
    for (int i = 0; i < n; i++)
        if (got[i] != want[i])
            fail_msg("element %d: got %g, want %g", i, (double)got[i], (double)want[i]);
}

/* The step's buffers: a = 1..12, b = 2 everywhere; output 1 is a's buffer. */
typedef struct step_bufs {
    loom_rt_buffer *in[2], *out[4];
} step_bufs;

static void make_step_bufs(step_bufs *sb, loom_rt_device *dev) {
    float a[12], b[12];
    for (int i = 0; i < 12; i++) {
        a[i] = (float)(i + 1);
        b[i] = 2.0f;
    }
    sb->in[0] = make_buffer(dev, 48, a);
    sb->in[1] = make_buffer(dev, 48, b);
    sb->out[0] = make_buffer(dev, 48, NULL);
    sb->out[1] = sb->in[0]; /* donation */
    loom_rt_buffer_retain(sb->out[1]);
    sb->out[2] = make_buffer(dev, 48, NULL);
    sb->out[3] = make_buffer(dev, 48, NULL);
}

static void free_step_bufs(step_bufs *sb) {
    for (int i = 0; i < 2; i++)
        loom_rt_buffer_release(sb->in[i]);
    for (int i = 0; i < 4; i++)
        loom_rt_buffer_release(sb->out[i]);
}

static loom_rt_pool *make_pool(int32_t n, const loom_allocator *a) {
    loom_rt_pool *pool = NULL;
    assert_int_equal(loom_rt_pool_create(n, a, &pool), LOOM_OK);
    return pool;
}

static loom_rt_executable *make_program(const loom_ir_graph *g, const loom_ir_plan *p,
                                        const loom_rt_kernel *kernels, loom_rt_pool *pool,
                                        const loom_allocator *a) {
    loom_rt_executable *exe = NULL;
    assert_int_equal(loom_rt_program_create(g, loom_ir_graph_hash(g), p, kernels, &released,
                                            release_code, pool, a, &exe),
                     LOOM_OK);
    assert_non_null(exe);
    return exe;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_program_computes_outputs_and_performs_copies(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_plan p;
    build_step(&g, &p, &sys);
    loom_rt_device *dev = make_device(&sys);
    loom_rt_pool *pool = make_pool(3, &sys);
    released = 0;
    loom_rt_executable *exe = make_program(&g, &p, step_kernels, pool, &sys);
    assert_true(loom_ir_graph_equal(&exe->graph, &g));
    assert_int_equal(exe->hash, loom_ir_graph_hash(&g));
    /* The executable holds its own copies: the originals can go now. */
    loom_ir_plan_deinit(&p);
    loom_ir_graph_deinit(&g);

    step_bufs sb;
    make_step_bufs(&sb, dev);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    memset(seen_bufs, 0, sizeof seen_bufs);
    assert_int_equal(exe->vt->run(exe, sb.in, sb.out, &d), LOOM_OK);

    /* a + b = i + 3; (a + b) * b = 2i + 6; that minus the old a = i + 5 (i from 0) */
    static const float out0[12] = {6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28};
    static const float out1[12] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    static const float out2[12] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    static const float out3[12] = {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2};
    assert_floats(sb.out[0]->data, out0, 12);
    assert_floats(sb.out[1]->data, out1, 12); /* the donated buffer: a's, overwritten */
    assert_floats(sb.in[0]->data, out1, 12);
    assert_floats(sb.out[2]->data, out2, 12);
    assert_floats(sb.out[3]->data, out3, 12);
    assert_floats(sb.in[1]->data, out3, 12); /* b untouched */

    /* Kernel 0 read the inputs and wrote the arena; kernel 1 read that same address and
     * wrote output 0; kernel 2 wrote 64 bytes further into the arena, not into a. */
    assert_ptr_equal(seen_bufs[0][0], sb.in[0]->data);
    assert_ptr_equal(seen_bufs[0][1], sb.in[1]->data);
    char *arena = seen_bufs[0][2];
    assert_non_null(arena);
    assert_ptr_equal(seen_bufs[1][0], arena);
    assert_ptr_equal(seen_bufs[1][1], sb.in[1]->data);
    assert_ptr_equal(seen_bufs[1][2], sb.out[0]->data);
    assert_ptr_equal(seen_bufs[2][0], sb.out[0]->data);
    assert_ptr_equal(seen_bufs[2][1], sb.in[0]->data);
    assert_ptr_equal(seen_bufs[2][2], arena + 64);

    assert_int_equal(released, 0);
    loom_rt_executable_destroy(exe);
    assert_int_equal(released, 1);
    free_step_bufs(&sb);
    loom_rt_pool_destroy(pool);
    assert_int_equal(dev->mem_current, 0);
    loom_rt_device_destroy(dev);
}

static void test_program_keeps_its_arena_between_runs_and_frees_it_on_destroy(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_plan p;
    build_step(&g, &p, &sys);
    loom_rt_device *dev = make_device(&sys);
    loom_rt_pool *pool = make_pool(2, &sys);
    released = 0;
    loom_rt_executable *exe = make_program(&g, &p, step_kernels, pool, &sys);
    step_bufs sb;
    make_step_bufs(&sb, dev);
    size_t base = dev->mem_current; /* 5 buffers of 48 bytes (output 1 is a's), each 64 */
    assert_int_equal(base, 5 * 64);

    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(exe->vt->run(exe, sb.in, sb.out, &d), LOOM_OK);
    void *arena1 = seen_bufs[0][2];
    assert_int_equal(dev->mem_current, base + 128); /* the arena, allocated once */
    /* Second step: a is now i + 5, so out1 = ((i + 5) + 2) * 2 - (i + 5) = i + 9. */
    assert_int_equal(exe->vt->run(exe, sb.in, sb.out, &d), LOOM_OK);
    assert_int_equal(d.code, LOOM_OK);
    assert_ptr_equal(seen_bufs[0][2], arena1);
    assert_int_equal(dev->mem_current, base + 128);
    const float *a = sb.in[0]->data;
    assert_true(a[0] == 9.0f && a[11] == 20.0f);

    loom_rt_executable_destroy(exe);
    assert_int_equal(dev->mem_current, base);
    free_step_bufs(&sb);
    loom_rt_pool_destroy(pool);
    loom_ir_plan_deinit(&p);
    loom_ir_graph_deinit(&g);
    loom_rt_device_destroy(dev);
}

static void test_program_prepare_allocates_the_arena_before_the_first_run(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_plan p;
    build_step(&g, &p, &sys);
    loom_rt_device *dev = make_device(&sys);
    loom_rt_pool *pool = make_pool(2, &sys);
    loom_rt_executable *exe = make_program(&g, &p, step_kernels, pool, &sys);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(dev->mem_current, 0);
    assert_int_equal(loom_rt_program_prepare(exe, dev, &d), LOOM_OK);
    assert_int_equal(dev->mem_current, 128);
    assert_int_equal(loom_rt_program_prepare(exe, dev, &d), LOOM_OK); /* idempotent */
    assert_int_equal(dev->mem_current, 128);
    step_bufs sb;
    make_step_bufs(&sb, dev);
    assert_int_equal(exe->vt->run(exe, sb.in, sb.out, &d), LOOM_OK);
    assert_int_equal(dev->mem_current, 128 + 5 * 64); /* the run allocated nothing */
    assert_int_equal(((const float *)sb.out[0]->data)[11], 28.0f);

    /* Other executable kinds: a no-op. */
    loom_rt_executable *interp = NULL;
    assert_int_equal(loom_rt_interp_executable_create(&g, 0, &sys, &interp), LOOM_OK);
    assert_int_equal(loom_rt_program_prepare(interp, dev, &d), LOOM_OK);
    assert_int_equal(dev->mem_current, 128 + 5 * 64);
    loom_rt_executable_destroy(interp);
    assert_int_equal(loom_rt_program_prepare(NULL, dev, &d), LOOM_STATUS_INVALID_ARGUMENT);

    loom_rt_executable_destroy(exe);
    free_step_bufs(&sb);
    loom_rt_pool_destroy(pool);
    loom_ir_plan_deinit(&p);
    loom_ir_graph_deinit(&g);
    loom_rt_device_destroy(dev);
}

static void test_program_resolves_an_unplaced_reshape_to_its_operand(void **state) {
    (void)state;
    /* %0 = input f32[2,3]; %1 = reshape %0 : f32[3,2] (no placement of its own);
     * %2 = neg %1 -> output 0; output 1 = %1 (a copy out of input 0). */
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    int32_t x = add_node(&g, LOOM_IR_OP_INPUT, NULL, 0, 2, S(2, 3), 0);
    int32_t r = add_node(&g, LOOM_IR_OP_RESHAPE, IDS(x), 2, S(3, 2), 0);
    int32_t n = add_node(&g, LOOM_IR_OP_NEG, IDS(r), 0, NULL, 0);
    assert_int_equal(loom_ir_graph_add_output(&g, n, -1), LOOM_OK);
    assert_int_equal(loom_ir_graph_add_output(&g, r, -1), LOOM_OK);
    loom_ir_plan p;
    loom_ir_plan_init(&p, &sys);
    assert_int_equal(loom_ir_plan_reset(&p, &g), LOOM_OK);
    add_kernel(&p, n, IDS(n), IDS(r), IDS(n));
    place(&p, x, LOOM_IR_BUFFER_INPUT, 0, 0, 24);
    place(&p, n, LOOM_IR_BUFFER_OUTPUT, 0, 0, 24);
    add_copy(&p, r, 1);
    const loom_rt_kernel kernels[] = {{neg_all, 6, 2, 0}};

    loom_rt_device *dev = make_device(&sys);
    loom_rt_pool *pool = make_pool(2, &sys);
    loom_rt_executable *exe = make_program(&g, &p, kernels, pool, &sys);
    static const float xs[6] = {1, -2, 3, -4, 5, -6};
    loom_rt_buffer *in[1] = {make_buffer(dev, 24, xs)};
    loom_rt_buffer *out[2] = {make_buffer(dev, 24, NULL), make_buffer(dev, 24, NULL)};
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(exe->vt->run(exe, in, out, &d), LOOM_OK);
    static const float negs[6] = {-1, 2, -3, 4, -5, 6};
    assert_floats(out[0]->data, negs, 6);
    assert_floats(out[1]->data, xs, 6);
    assert_ptr_equal(seen_bufs[0][0], in[0]->data);
    assert_int_equal(dev->mem_current, 3 * 64); /* no arena: arena_bytes is 0 */

    loom_rt_executable_destroy(exe);
    loom_rt_buffer_release(in[0]);
    loom_rt_buffer_release(out[0]);
    loom_rt_buffer_release(out[1]);
    loom_rt_pool_destroy(pool);
    loom_ir_plan_deinit(&p);
    loom_ir_graph_deinit(&g);
    loom_rt_device_destroy(dev);
}

/* Each breaks one thing in the step's plan or kernels. */
typedef void (*plan_breaker)(loom_ir_plan *p, loom_rt_kernel *k);
static void break_missing_placement(loom_ir_plan *p, loom_rt_kernel *k) {
    (void)k;
    p->has_placement[3] = false; /* kernel 1's result */
}
static void break_arena_overflow(loom_ir_plan *p, loom_rt_kernel *k) {
    (void)k;
    p->placement[4].offset = 96; /* 96 + 48 > 128 */
}
static void break_output_index(loom_ir_plan *p, loom_rt_kernel *k) {
    (void)k;
    p->placement[3].index = 4; /* 4 outputs: 0..3 */
}
static void break_copy_output(loom_ir_plan *p, loom_rt_kernel *k) {
    (void)k;
    p->copies[0].output = -1;
}
static void break_null_kernel(loom_ir_plan *p, loom_rt_kernel *k) {
    (void)p;
    k[1].fn = NULL;
}
static void break_zero_grain(loom_ir_plan *p, loom_rt_kernel *k) {
    (void)p;
    k[2].grain = 0;
}
static void break_node_count(loom_ir_plan *p, loom_rt_kernel *k) {
    (void)k;
    p->n_nodes = 4; /* deinit frees by n_nodes: the test restores it */
}

static void test_program_create_rejects_bad_plans_and_releases_the_code(void **state) {
    (void)state;
    const plan_breaker breakers[] = {break_missing_placement, break_arena_overflow,
                                     break_output_index, break_copy_output, break_null_kernel,
                                     break_zero_grain, break_node_count};
    loom_rt_pool *pool = make_pool(1, &sys);
    for (size_t i = 0; i < sizeof breakers / sizeof breakers[0]; i++) {
        loom_ir_graph g;
        loom_ir_plan p;
        build_step(&g, &p, &sys);
        loom_rt_kernel k[3];
        memcpy(k, step_kernels, sizeof k);
        breakers[i](&p, k);
        released = 0;
        loom_rt_executable *exe = (loom_rt_executable *)&exe;
        loom_status st = loom_rt_program_create(&g, 1, &p, k, &released, release_code, pool,
                                                &sys, &exe);
        if (st != LOOM_STATUS_INVALID_ARGUMENT)
            fail_msg("breaker %zu: got %s", i, loom_status_name(st));
        assert_null(exe);
        assert_int_equal(released, 1);
        p.n_nodes = g.n_nodes;
        loom_ir_plan_deinit(&p);
        loom_ir_graph_deinit(&g);
    }
    /* NULL arguments: also released. */
    loom_ir_graph g;
    loom_ir_plan p;
    build_step(&g, &p, &sys);
    loom_rt_executable *exe = NULL;
    released = 0;
    assert_int_equal(loom_rt_program_create(&g, 1, &p, step_kernels, &released, release_code,
                                            NULL, &sys, &exe),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_rt_program_create(NULL, 1, &p, step_kernels, &released, release_code,
                                            pool, &sys, &exe),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(released, 2);
    assert_int_equal(loom_rt_program_create(&g, 1, &p, step_kernels, NULL, NULL, pool, &sys,
                                            NULL),
                     LOOM_STATUS_INVALID_ARGUMENT);
    loom_ir_plan_deinit(&p);
    loom_ir_graph_deinit(&g);
    loom_rt_pool_destroy(pool);
}

static void test_program_run_rejects_missing_and_short_buffers(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_plan p;
    build_step(&g, &p, &sys);
    loom_rt_device *dev = make_device(&sys);
    loom_rt_pool *pool = make_pool(2, &sys);
    loom_rt_executable *exe = make_program(&g, &p, step_kernels, pool, &sys);
    step_bufs sb;
    make_step_bufs(&sb, dev);

    loom_rt_buffer *short_b = make_buffer(dev, 16, NULL);
    loom_rt_buffer *in[2] = {sb.in[0], short_b};
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(exe->vt->run(exe, in, sb.out, &d), LOOM_STATUS_INVALID_ARGUMENT);
    assert_string_equal(d.msg, "program: input 1 buffer has 16 bytes, its value f32[4,3] needs 48");

    loom_rt_buffer *out[4] = {sb.out[0], sb.out[1], NULL, sb.out[3]};
    loom_ir_diag_init(&d);
    assert_int_equal(exe->vt->run(exe, sb.in, out, &d), LOOM_STATUS_INVALID_ARGUMENT);
    assert_string_equal(d.msg, "program: output 2 has no buffer");

    /* Nothing ran: a is still 1..12. */
    assert_true(((const float *)sb.in[0]->data)[0] == 1.0f);
    assert_int_equal(dev->mem_current, 6 * 64); /* nor was the arena allocated */

    loom_rt_buffer_release(short_b);
    loom_rt_executable_destroy(exe);
    free_step_bufs(&sb);
    loom_rt_pool_destroy(pool);
    loom_ir_plan_deinit(&p);
    loom_ir_graph_deinit(&g);
    loom_rt_device_destroy(dev);
}

/* A kernel that runs its own executable again: the nested run must refuse. */
static loom_rt_executable *nested_exe;
static loom_rt_buffer *const *nested_in, *const *nested_out;
static loom_status nested_status;
static char nested_msg[512];

static void reentering_add(void *const *bufs, int64_t lo, int64_t hi) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    nested_status = nested_exe->vt->run(nested_exe, nested_in, nested_out, &d);
    memcpy(nested_msg, d.msg, sizeof nested_msg);
    add_rows(bufs, lo, hi);
}

static void test_program_refuses_overlapping_runs(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_plan p;
    build_step(&g, &p, &sys);
    loom_rt_device *dev = make_device(&sys);
    loom_rt_pool *pool = make_pool(1, &sys);
    loom_rt_kernel k[3];
    memcpy(k, step_kernels, sizeof k);
    k[0].fn = reentering_add;
    loom_rt_executable *exe = make_program(&g, &p, k, pool, &sys);
    step_bufs sb;
    make_step_bufs(&sb, dev);
    nested_exe = exe;
    nested_in = sb.in;
    nested_out = sb.out;
    nested_status = LOOM_OK;
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(exe->vt->run(exe, sb.in, sb.out, &d), LOOM_OK);
    assert_int_equal(nested_status, LOOM_STATUS_INTERNAL);
    assert_non_null(strstr(nested_msg, "overlap"));
    assert_int_equal(((const float *)sb.out[0]->data)[0], 6); /* the outer run finished */
    /* and the flag was cleared: a later run works */
    assert_int_equal(loom_rt_program_prepare(exe, dev, &d), LOOM_OK);

    loom_rt_executable_destroy(exe);
    free_step_bufs(&sb);
    loom_rt_pool_destroy(pool);
    loom_ir_plan_deinit(&p);
    loom_ir_graph_deinit(&g);
    loom_rt_device_destroy(dev);
}

static void test_program_create_out_of_memory_leaks_nothing(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_plan p;
    build_step(&g, &p, &sys);
    loom_rt_pool *pool = make_pool(1, &sys);
    for (int64_t fail = 1;; fail++) {
        test_alloc ta = {.fail_at = fail};
        loom_allocator a = test_alloc_make(&ta);
        loom_rt_executable *exe = NULL;
        released = 0;
        loom_status st = loom_rt_program_create(&g, 7, &p, step_kernels, &released,
                                                release_code, pool, &a, &exe);
        if (st == LOOM_OK) {
            assert_true(fail > 5);
            loom_rt_executable_destroy(exe);
            assert_int_equal(released, 1);
            assert_int_equal(ta.live_bytes, 0);
            break;
        }
        assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
        assert_null(exe);
        assert_int_equal(released, 1);
        assert_int_equal(ta.live_bytes, 0);
        assert_int_equal(ta.live_blocks, 0);
    }
    loom_rt_pool_destroy(pool);
    loom_ir_plan_deinit(&p);
    loom_ir_graph_deinit(&g);
}

static void test_program_run_reports_arena_out_of_memory(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_ir_graph g;
    loom_ir_plan p;
    build_step(&g, &p, &sys);
    loom_rt_device *dev = make_device(&a);
    loom_rt_pool *pool = make_pool(1, &sys);
    loom_rt_executable *exe = make_program(&g, &p, step_kernels, pool, &sys);
    step_bufs sb;
    make_step_bufs(&sb, dev);
    ta.fail_at = ta.n_allocs + 1; /* the arena's buffer header */
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(exe->vt->run(exe, sb.in, sb.out, &d), LOOM_STATUS_OUT_OF_MEMORY);
    assert_string_equal(d.msg, "program: out of memory allocating the 128-byte arena on npu:0");
    assert_true(((const float *)sb.in[0]->data)[0] == 1.0f); /* nothing ran */
    /* The next run gets its memory and works. */
    ta.fail_at = 0;
    loom_ir_diag_init(&d);
    assert_int_equal(exe->vt->run(exe, sb.in, sb.out, &d), LOOM_OK);
    assert_true(((const float *)sb.in[0]->data)[0] == 5.0f);

    loom_rt_executable_destroy(exe);
    free_step_bufs(&sb);
    loom_rt_pool_destroy(pool);
    loom_ir_plan_deinit(&p);
    loom_ir_graph_deinit(&g);
    loom_rt_device_destroy(dev);
    assert_int_equal(ta.live_bytes, 0);
}

/* A program whose kernels 0 and 2 share add_rows' code (0x40 bytes, as if compiled) and
 * whose kernel 1's size is not known, and a fresh directory for what perf reads. */
typedef struct code_fx {
    loom_ir_graph g;
    loom_ir_plan p;
    loom_rt_pool *pool;
    loom_rt_executable *exe;
    char dir[40];
    char name[128]; /* the first kernel's name, as perf is given it */
    loom_ir_diag d;
} code_fx;

static void code_fx_init(code_fx *f) {
    build_step(&f->g, &f->p, &sys);
    f->pool = make_pool(1, &sys);
    const loom_rt_kernel ks[] = {
        {add_rows, 4, 1, 0x40}, {mul_rows, 4, 1, 0}, {add_rows, 4, 1, 0x40}};
    f->exe = make_program(&f->g, &f->p, ks, f->pool, &sys);
    snprintf(f->dir, sizeof f->dir, "/tmp/loom-perf-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->name, sizeof f->name, "loom %016llx:0 add f32[4,3] ? (+1 kernel sharing its code)",
             (unsigned long long)f->exe->hash);
    loom_ir_diag_init(&f->d);
}

static void code_fx_deinit(code_fx *f) {
    assert_int_equal(rmdir(f->dir), 0); /* the test removed what it wrote */
    loom_rt_executable_destroy(f->exe);
    loom_rt_pool_destroy(f->pool);
    loom_ir_plan_deinit(&f->p);
    loom_ir_graph_deinit(&f->g);
}

static void test_program_perf_map_names_each_piece_of_code_once(void **state) {
    (void)state;
    code_fx f;
    code_fx_init(&f);
    char path[64], link_path[64], missing[64];
    snprintf(path, sizeof path, "%s/perf.map", f.dir);
    snprintf(link_path, sizeof link_path, "%s/link.map", f.dir);
    snprintf(missing, sizeof missing, "%s/none/perf.map", f.dir);
    assert_int_equal(loom_rt_program_perf_map(f.exe, &f.p, &f.g, path, &f.d), LOOM_OK);
    assert_int_equal(loom_rt_program_perf_map(f.exe, &f.p, &f.g, path, &f.d),
                     LOOM_OK); /* appends */
    char line[200], want[400];
    snprintf(line, sizeof line, "%lx 40 %s\n", (unsigned long)(uintptr_t)add_rows, f.name);
    snprintf(want, sizeof want, "%s%s", line, line);
    char *got = tu_read_file(path);
    assert_string_equal(got, want);
    free(got);

    /* a directory that does not exist, a symlink (never followed), no path */
    assert_int_equal(loom_rt_program_perf_map(f.exe, &f.p, &f.g, missing, &f.d),
                     LOOM_STATUS_IO_ERROR);
    assert_non_null(strstr(f.d.msg, "perf map: cannot open"));
    assert_non_null(strstr(f.d.msg, missing));
    assert_int_equal(symlink(path, link_path), 0);
    loom_ir_diag_init(&f.d);
    assert_int_equal(loom_rt_program_perf_map(f.exe, &f.p, &f.g, link_path, &f.d),
                     LOOM_STATUS_IO_ERROR);
    assert_non_null(strstr(f.d.msg, link_path));
    got = tu_read_file(path);
    assert_string_equal(got, want);
    free(got);
    assert_int_equal(loom_rt_program_perf_map(f.exe, &f.p, &f.g, NULL, &f.d),
                     LOOM_STATUS_INVALID_ARGUMENT);
    unlink(link_path);
    unlink(path);
    /* no kernel with a known size: nothing to write, and no file */
    loom_rt_executable *plain = make_program(&f.g, &f.p, step_kernels, f.pool, &sys);
    assert_int_equal(loom_rt_program_perf_map(plain, &f.p, &f.g, path, &f.d), LOOM_OK);
    assert_int_equal(access(path, F_OK), -1);
    loom_rt_executable_destroy(plain);
    code_fx_deinit(&f);
}

/* The jitdump: perf's header, then one code-load record per distinct piece of code with its
 * name and bytes; the file stays mapped executable (how perf record learns of it). */
static void test_program_jitdump_holds_each_piece_of_code_and_its_bytes(void **state) {
    (void)state;
    code_fx f;
    code_fx_init(&f);
    char missing[64], path[64];
    snprintf(missing, sizeof missing, "%s/none", f.dir);
    snprintf(path, sizeof path, "%s/jit-%ld.dump", f.dir, (long)getpid());
    assert_int_equal(loom_rt_program_jitdump(f.exe, &f.p, &f.g, missing, &f.d),
                     LOOM_STATUS_IO_ERROR);
    assert_non_null(strstr(f.d.msg, "jitdump: cannot open"));
    assert_non_null(strstr(f.d.msg, missing));
    assert_int_equal(loom_rt_program_jitdump(f.exe, &f.p, &f.g, NULL, &f.d),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_rt_program_jitdump(f.exe, &f.p, &f.g, f.dir, &f.d), LOOM_OK);

    size_t name_len = strlen(f.name) + 1, rec = 56 + name_len + 0x40;
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    unsigned char buf[512];
    assert_int_equal(fread(buf, 1, sizeof buf, fp), 40 + rec); /* all of it */
    fclose(fp);
    uint32_t u32[6];
    uint64_t u64[4];
    memcpy(u32, buf, 24); /* magic, version, total size, machine, pad, pid */
    assert_int_equal(u32[0], 0x4A695444);
    assert_int_equal(u32[1], 1);
    assert_int_equal(u32[2], 40);
#if defined(__x86_64__)
    assert_int_equal(u32[3], 62);
#endif
    assert_int_equal(u32[5], (uint32_t)getpid());
    memcpy(u32, buf + 40, 8); /* the record: id, total size */
    assert_int_equal(u32[0], 0);
    assert_int_equal(u32[1], rec);
    memcpy(u32, buf + 56, 4);
    assert_int_equal(u32[0], (uint32_t)getpid());
    memcpy(u64, buf + 64, 32); /* vma, code address, size, index */
    assert_int_equal(u64[0], (uint64_t)(uintptr_t)add_rows);
    assert_int_equal(u64[1], (uint64_t)(uintptr_t)add_rows);
    assert_int_equal(u64[2], 0x40);
    assert_int_equal(u64[3], 0);
    assert_string_equal((const char *)buf + 96, f.name);
    assert_memory_equal(buf + 96 + name_len, (const void *)(uintptr_t)add_rows, 0x40);
    assert_true(tu_mapped_executable(0, 0, path)); /* the file is mapped executable */
    unlink(path);
    code_fx_deinit(&f);
}

int main(void) {
    sys = loom_allocator_system();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_program_computes_outputs_and_performs_copies),
        cmocka_unit_test(test_program_keeps_its_arena_between_runs_and_frees_it_on_destroy),
        cmocka_unit_test(test_program_prepare_allocates_the_arena_before_the_first_run),
        cmocka_unit_test(test_program_resolves_an_unplaced_reshape_to_its_operand),
        cmocka_unit_test(test_program_create_rejects_bad_plans_and_releases_the_code),
        cmocka_unit_test(test_program_run_rejects_missing_and_short_buffers),
        cmocka_unit_test(test_program_refuses_overlapping_runs),
        cmocka_unit_test(test_program_create_out_of_memory_leaks_nothing),
        cmocka_unit_test(test_program_run_reports_arena_out_of_memory),
        cmocka_unit_test(test_program_perf_map_names_each_piece_of_code_once),
        cmocka_unit_test(test_program_jitdump_holds_each_piece_of_code_and_its_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
