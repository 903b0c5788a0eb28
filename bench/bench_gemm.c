/* GEMM benchmark: Loom's scheduled fp32 matmul kernel (MLIR transform schedule, then the
 * JIT fast path of TOOLCHAIN.md) against OpenBLAS cblas_sgemm, at 1 and 2 threads; with
 * --dtype bf16|f16, Loom's 16-bit matmul kernels (codegen's own, as a step compiles them)
 * against oneDNN's matmul of that dtype and Loom's f32 matmul kernel of the same shape. */
#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Dialect/Linalg.h>
#include <mlir-c/IR.h>
#include <mlir-c/Pass.h>
#include <mlir-c/RegisterEverything.h>
#include <mlir-c/Target/LLVMIR.h>
#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef LOOM_BENCH_HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef LOOM_BENCH_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
void omp_set_num_threads(int n); /* oneDNN's OpenMP runtime (libgomp) */
#endif

#include "codegen/codegen.h"
#include "codegen/matmul_schedule.h"
#include "ir/plan.h"
#include "runtime/kernel.h"

/* TOOLCHAIN.md's cheap LLVM pipeline (LICM matters); --o3 uses default<O3> instead. */
static const char cheap_pipeline[] =
    "function(sroa,early-cse,instcombine,simplifycfg,loop-mssa(loop-rotate,licm),"
    "loop-vectorize,instcombine,simplifycfg)";

static const char mlir_pipeline[] =
    "builtin.module(func.func(convert-linalg-to-loops),"
    "convert-vector-to-scf{full-unroll=true},lower-affine,convert-scf-to-cf,"
    "expand-strided-metadata,lower-affine,convert-vector-to-llvm,"
    "finalize-memref-to-llvm,convert-arith-to-llvm,convert-func-to-llvm,"
    "convert-cf-to-llvm,reconcile-unrealized-casts)";

typedef struct shape {
    int64_t m, n, k;
    const char *note;
} shape;

static const shape default_shapes[] = {
    {256, 256, 256, ""},       {512, 512, 512, ""},        {1024, 1024, 1024, ""},
    {2048, 2048, 2048, ""},    {64, 512, 784, "MLP fc1"},  {256, 512, 784, "MLP fc1"},
    {64, 512, 512, "MLP fc2"}, {256, 512, 512, "MLP fc2"}, {64, 10, 512, "MLP fc3"},
    {256, 10, 512, "MLP fc3"},
};

typedef struct options {
    int runs;
    bool o3, no_avx512, best;
    int threads[4];
    int n_threads;
    int64_t rows; /* rows per kernel call; 0: M / threads */
    shape shapes[32];
    int n_shapes;
    loom_dtype dtype; /* F32: the fp32 benchmark; BF16, F16: the 16-bit one */
} options;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* --cpu-time: the calling thread's CPU time instead of wall time (one thread only: time
 * slices lost to other processes on a shared machine are not counted). */
static bool use_cpu_time;

static double sample_s(void) {
    if (!use_cpu_time)
        return now_s();
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ---- compiling one kernel ---------------------------------------------------------------- */

typedef struct memref2 {
    float *allocated, *aligned;
    int64_t offset, sizes[2], strides[2];
} memref2;

typedef void (*gemm_fn)(memref2 *a, memref2 *b, memref2 *c);

typedef struct compiled {
    int64_t m, n, k;
    gemm_fn fn;
    double ms;
} compiled;

typedef struct jit {
    MlirContext ctx;
    compiled done[64]; /* kernels already in the JIT, by shape (symbols must be unique) */
    int n_done;
    LLVMOrcLLJITRef lljit;
    LLVMTargetMachineRef tm;
    char *triple;
    const char *llvm_pipeline;
} jit;

static MlirStringRef sr(const char *s) {
    return mlirStringRefCreateFromCString(s);
}

static MlirNamedAttribute named(MlirContext ctx, const char *name, MlirAttribute a) {
    return mlirNamedAttributeGet(mlirIdentifierGet(ctx, sr(name)), a);
}

static void die(const char *what, const char *detail) {
    fprintf(stderr, "bench_gemm: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(1);
}

static void check_llvm(LLVMErrorRef err, const char *what) {
    if (err) {
        char *msg = LLVMGetErrorMessage(err);
        fprintf(stderr, "bench_gemm: %s: %s\n", what, msg);
        LLVMDisposeErrorMessage(msg);
        exit(1);
    }
}

/* func.func @name(%A: memref<MxKxf32>, %B: memref<KxNxf32>, %C: memref<MxNxf32>)
 *   { linalg.fill 0 -> C; linalg.matmul ins(A, B) outs(C) }: C = A x B, as Loom's matmul
 * kernels compute it (sgemm with beta = 0). */
static MlirModule build_gemm(MlirContext ctx, const char *name, int64_t m, int64_t n, int64_t k) {
    MlirLocation loc = mlirLocationUnknownGet(ctx);
    MlirType f32 = mlirF32TypeGet(ctx);
    int64_t sa[2] = {m, k}, sb[2] = {k, n}, sc[2] = {m, n};
    MlirType args[3] = {
        mlirMemRefTypeContiguousGet(f32, 2, sa, mlirAttributeGetNull()),
        mlirMemRefTypeContiguousGet(f32, 2, sb, mlirAttributeGetNull()),
        mlirMemRefTypeContiguousGet(f32, 2, sc, mlirAttributeGetNull()),
    };
    MlirLocation locs[3] = {loc, loc, loc};
    MlirRegion body = mlirRegionCreate();
    MlirBlock block = mlirBlockCreate(3, args, locs);
    mlirRegionAppendOwnedBlock(body, block);
    MlirValue a = mlirBlockGetArgument(block, 0), b = mlirBlockGetArgument(block, 1),
              c = mlirBlockGetArgument(block, 2);

    MlirOperationState cst = mlirOperationStateGet(sr("arith.constant"), loc);
    MlirNamedAttribute zero = named(ctx, "value", mlirFloatAttrDoubleGet(ctx, f32, 0.0));
    mlirOperationStateAddAttributes(&cst, 1, &zero);
    mlirOperationStateAddResults(&cst, 1, &f32);
    MlirOperation cst_op = mlirOperationCreate(&cst);
    mlirBlockAppendOwnedOperation(block, cst_op);

    /* Named linalg ops: operands, segment sizes, an empty region the C API fills. */
    const char *ops[2] = {"linalg.fill", "linalg.matmul"};
    for (int i = 0; i < 2; i++) {
        MlirOperationState st = mlirOperationStateGet(sr(ops[i]), loc);
        MlirValue fill_operands[2] = {mlirOperationGetResult(cst_op, 0), c};
        MlirValue mm_operands[3] = {a, b, c};
        int32_t seg_fill[2] = {1, 1}, seg_mm[2] = {2, 1};
        mlirOperationStateAddOperands(&st, i == 0 ? 2 : 3, i == 0 ? fill_operands : mm_operands);
        MlirNamedAttribute seg = named(ctx, "operandSegmentSizes",
                                       mlirDenseI32ArrayGet(ctx, 2, i == 0 ? seg_fill : seg_mm));
        mlirOperationStateAddAttributes(&st, 1, &seg);
        MlirRegion r = mlirRegionCreate();
        mlirOperationStateAddOwnedRegions(&st, 1, &r);
        MlirOperation op = mlirOperationCreate(&st);
        mlirLinalgFillBuiltinNamedOpRegion(op);
        mlirBlockAppendOwnedOperation(block, op);
    }
    MlirOperationState ret = mlirOperationStateGet(sr("func.return"), loc);
    mlirBlockAppendOwnedOperation(block, mlirOperationCreate(&ret));

    MlirNamedAttribute attrs[3] = {
        named(ctx, "sym_name", mlirStringAttrGet(ctx, sr(name))),
        named(ctx, "function_type", mlirTypeAttrGet(mlirFunctionTypeGet(ctx, 3, args, 0, NULL))),
        named(ctx, "llvm.emit_c_interface", mlirUnitAttrGet(ctx)),
    };
    MlirOperationState fn = mlirOperationStateGet(sr("func.func"), loc);
    mlirOperationStateAddAttributes(&fn, 3, attrs);
    mlirOperationStateAddOwnedRegions(&fn, 1, &body);
    MlirModule module = mlirModuleCreateEmpty(loc);
    mlirBlockAppendOwnedOperation(mlirModuleGetBody(module), mlirOperationCreate(&fn));
    return module;
}

static void print_stderr(MlirStringRef s, void *ud) {
    (void)ud;
    fprintf(stderr, "%.*s", (int)s.length, s.data);
}

/* Host features, with every AVX-512 feature turned off when asked (to measure what an
 * AVX2-only machine would run). Owned by the caller (LLVMDisposeMessage). */
static char *target_features(bool no_avx512) {
    char *f = LLVMGetHostCPUFeatures();
    if (no_avx512)
        for (char *p = f; (p = strstr(p, "+avx512")) != NULL; p++)
            *p = '-';
    return f;
}

static void jit_init(jit *j, const options *o) {
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
    j->ctx = mlirContextCreate();
    MlirDialectRegistry reg = mlirDialectRegistryCreate();
    mlirRegisterAllDialects(reg);
    mlirContextAppendDialectRegistry(j->ctx, reg);
    mlirDialectRegistryDestroy(reg);
    mlirContextLoadAllAvailableDialects(j->ctx);
    mlirRegisterAllLLVMTranslations(j->ctx);

    j->triple = LLVMGetDefaultTargetTriple();
    LLVMTargetRef target;
    char *err = NULL;
    if (LLVMGetTargetFromTriple(j->triple, &target, &err))
        die("no LLVM target for the host", err);
    char *cpu = LLVMGetHostCPUName(), *features = target_features(o->no_avx512);
    j->tm = LLVMCreateTargetMachine(target, j->triple, cpu, features, LLVMCodeGenLevelAggressive,
                                    LLVMRelocPIC, LLVMCodeModelSmall);
    LLVMDisposeMessage(cpu);
    LLVMDisposeMessage(features);
    check_llvm(LLVMOrcCreateLLJIT(&j->lljit, NULL), "creating the LLJIT");
    LLVMOrcDefinitionGeneratorRef gen;
    check_llvm(LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
                   &gen, LLVMOrcLLJITGetGlobalPrefix(j->lljit), NULL, NULL),
               "creating the process symbol generator");
    LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(j->lljit), gen);
    j->llvm_pipeline = o->o3 ? "default<O3>" : cheap_pipeline;
}

static void jit_deinit(jit *j) {
    LLVMOrcDisposeLLJIT(j->lljit);
    LLVMDisposeTargetMachine(j->tm);
    LLVMDisposeMessage(j->triple);
    mlirContextDestroy(j->ctx);
}

/* Schedules, lowers and JITs the C = A x B kernel for m x n x k; *out_ms gets the compile
 * time (schedule to object, without the JIT link). */
static gemm_fn compile_gemm(jit *j, int64_t m, int64_t n, int64_t k, double *out_ms) {
    for (int i = 0; i < j->n_done; i++) {
        if (j->done[i].m == m && j->done[i].n == n && j->done[i].k == k) {
            *out_ms = j->done[i].ms;
            return j->done[i].fn;
        }
    }
    char name[96];
    snprintf(name, sizeof name, "gemm_%lld_%lld_%lld", (long long)m, (long long)n, (long long)k);
    MlirModule module = build_gemm(j->ctx, name, m, n, k);
    double t0 = now_s();
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_cg_schedule_matmuls(module, &d) != LOOM_OK)
        die("scheduling failed", d.msg);
    MlirPassManager pm = mlirPassManagerCreate(j->ctx);
    if (mlirLogicalResultIsFailure(mlirParsePassPipeline(mlirPassManagerGetAsOpPassManager(pm),
                                                         sr(mlir_pipeline), print_stderr, NULL)))
        die("bad MLIR pipeline", mlir_pipeline);
    if (mlirLogicalResultIsFailure(mlirPassManagerRunOnOp(pm, mlirModuleGetOperation(module))))
        die("MLIR lowering failed", name);
    mlirPassManagerDestroy(pm);

    LLVMContextRef llctx = LLVMContextCreate();
    LLVMModuleRef llmod = mlirTranslateModuleToLLVMIR(mlirModuleGetOperation(module), llctx);
    if (!llmod)
        die("translation to LLVM IR failed", name);
    mlirModuleDestroy(module);
    /* Without the triple and data layout nothing vectorizes (TOOLCHAIN.md). */
    LLVMSetTarget(llmod, j->triple);
    LLVMTargetDataRef layout = LLVMCreateTargetDataLayout(j->tm);
    LLVMSetModuleDataLayout(llmod, layout);
    LLVMDisposeTargetData(layout);
    LLVMPassBuilderOptionsRef pbo = LLVMCreatePassBuilderOptions();
    check_llvm(LLVMRunPasses(llmod, j->llvm_pipeline, j->tm, pbo), "LLVM passes");
    LLVMDisposePassBuilderOptions(pbo);
    char *err = NULL;
    LLVMMemoryBufferRef obj;
    if (LLVMTargetMachineEmitToMemoryBuffer(j->tm, llmod, LLVMObjectFile, &err, &obj))
        die("code generation failed", err);
    LLVMDisposeModule(llmod);
    LLVMContextDispose(llctx);
    *out_ms = (now_s() - t0) * 1e3;

    check_llvm(LLVMOrcLLJITAddObjectFile(j->lljit, LLVMOrcLLJITGetMainJITDylib(j->lljit), obj),
               "adding the object");
    char sym[128];
    snprintf(sym, sizeof sym, "_mlir_ciface_%s", name);
    LLVMOrcExecutorAddress addr;
    check_llvm(LLVMOrcLLJITLookup(j->lljit, &addr, sym), "looking up the kernel");
    gemm_fn fn;
    void *p = (void *)(uintptr_t)addr;
    memcpy(&fn, &p, sizeof fn); /* ISO C has no object-to-function pointer cast */
    if (j->n_done < (int)(sizeof j->done / sizeof j->done[0]))
        j->done[j->n_done++] = (compiled){m, n, k, fn, *out_ms};
    return fn;
}

/* ---- running ---------------------------------------------------------------------------- */

typedef struct problem {
    int64_t m, n, k;
    float *a, *b, *c;
    gemm_fn half;  /* the kernel for one block of m / parts rows */
    int64_t parts; /* row blocks; a thread runs a contiguous range of them */
} problem;

/* One chunk of the runtime's parallel_for: the kernel on row blocks [lo, hi). */
static void run_rows(void *ud, int64_t lo, int64_t hi) {
    problem *p = ud;
    int64_t rows = p->m / p->parts;
    for (int64_t i = lo; i < hi; i++) {
        float *a = p->a + i * rows * p->k, *c = p->c + i * rows * p->n;
        memref2 ma = {a, a, 0, {rows, p->k}, {p->k, 1}};
        memref2 mb = {p->b, p->b, 0, {p->k, p->n}, {p->n, 1}};
        memref2 mc = {c, c, 0, {rows, p->n}, {p->n, 1}};
        p->half(&ma, &mb, &mc);
    }
}

typedef struct runner {
    problem *p;
    loom_rt_pool *pool;
    int threads;
    bool blas;
    void (*run)(void *ud); /* when set: runs the whole product (16-bit benchmark) */
    void *ud;
} runner;

static void run_once(runner *r) {
    problem *p = r->p;
    if (r->run) {
        r->run(r->ud);
        return;
    }
#ifdef LOOM_BENCH_HAVE_OPENBLAS
    if (r->blas) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)p->m, (int)p->n, (int)p->k,
                    1.0f, p->a, (int)p->k, p->b, (int)p->n, 0.0f, p->c, (int)p->n);
        return;
    }
#endif
    if (r->threads == 1)
        run_rows(p, 0, p->parts);
    else /* the runtime's split: one contiguous block of rows per thread */
        loom_rt_pool_parallel_for(r->pool, p->parts, 1, run_rows, p);
}

/* Times `reps` back-to-back runs; GFLOP/s. */
static double timed(runner *r, int64_t reps) {
    double flops = 2.0 * (double)r->p->m * (double)r->p->n * (double)r->p->k;
    double t0 = sample_s();
    for (int64_t q = 0; q < reps; q++)
        run_once(r);
    return flops * (double)reps / (sample_s() - t0) / 1e9;
}

/* Runs per timed sample so that one sample lasts >= 50 ms. */
static int64_t reps_for(runner *r) {
    run_once(r); /* warm-up: page faults, caches, thread wake-up */
    double t0 = now_s();
    run_once(r);
    double one = now_s() - t0;
    return one > 0.05 ? 1 : (int64_t)(0.05 / (one > 1e-7 ? one : 1e-7)) + 1;
}

/* OpenBLAS's idle threads spin for up to 2^28 cycles (~0.1 s) before they sleep: with
 * several threads, wait them out before timing Loom, or they take its cores. */
static void let_blas_threads_sleep(const runner *r) {
    if (r->blas && r->threads > 1) {
        struct timespec t = {0, 200 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
}

/* GFLOP/s of each runner (n of them) over `runs` samples, taken in turns so that both
 * see the same machine (other processes, clock changes): the median, or the best sample
 * with `best` (the undisturbed speed on a shared machine). */
static void measure(runner *rs, int n, int runs, bool best, double *out) {
    int64_t reps[3];
    double rates[3][64];
    if (runs > 64)
        runs = 64;
    for (int i = 0; i < n; i++) {
        reps[i] = reps_for(&rs[i]);
        let_blas_threads_sleep(&rs[i]);
    }
    for (int s = 0; s < runs; s++) {
        for (int i = 0; i < n; i++) {
            rates[i][s] = timed(&rs[i], reps[i]);
            let_blas_threads_sleep(&rs[i]);
        }
    }
    for (int i = 0; i < n; i++) {
        qsort(rates[i], (size_t)runs, sizeof rates[i][0], cmp_double);
        out[i] = best ? rates[i][runs - 1] : rates[i][runs / 2];
    }
}

static float *random_matrix(int64_t n, uint64_t seed) {
    float *x = aligned_alloc(64, ((size_t)n * sizeof(float) + 63) / 64 * 64);
    if (!x)
        die("out of memory", NULL);
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(seed >> 40) / (double)(1ull << 23) - 1.0);
    }
    return x;
}

/* Max |C - ref| / (sum |a||b|) over a sample of rows, ref in double: the kernel must be
 * right before its speed means anything. */
static double check(const problem *p) {
    double worst = 0;
    int64_t step = p->m > 64 ? p->m / 16 : 1;
    for (int64_t i = 0; i < p->m; i += (i + step < p->m - 8 ? step : 1)) /* and the last rows */
        for (int64_t j = 0; j < p->n; j++) {
            double ref = 0, scale = 0;
            for (int64_t q = 0; q < p->k; q++) {
                double t = (double)p->a[i * p->k + q] * p->b[q * p->n + j];
                ref += t;
                scale += fabs(t);
            }
            double e = fabs(p->c[i * p->n + j] - ref) / (scale > 1 ? scale : 1);
            if (e > worst)
                worst = e;
        }
    return worst;
}

/* ---- Loom's codegen (16-bit matmuls against oneDNN; the f32 "codegen" column) ------------ */

/* One matmul kernel compiled by Loom's codegen as a step would (a graph A x B, one MATMUL
 * kernel), run over its tasks by the runtime's pool. */
typedef struct loom_mm {
    loom_ir_graph g;
    loom_ir_plan plan;
    loom_cg_code *code;
    loom_rt_kernel k;
    void *bufs[3];
    loom_rt_pool *pool;
    double compile_ms;
} loom_mm;

static void loom_mm_chunk(void *ud, int64_t lo, int64_t hi) {
    loom_mm *mm = ud;
    mm->k.fn(mm->bufs, lo, hi);
}

static void loom_mm_run(void *ud) {
    loom_mm *mm = ud;
    if (!mm->pool)
        mm->k.fn(mm->bufs, 0, mm->k.extent);
    else
        loom_rt_pool_parallel_for(mm->pool, mm->k.extent, mm->k.grain, loom_mm_chunk, mm);
}

static void loom_mm_build(loom_mm *mm, const loom_allocator *al, loom_dtype dt, const shape *sh,
                          void *a, void *b, void *c, loom_rt_pool *pool) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_ir_graph_init(&mm->g, al);
    loom_ir_plan_init(&mm->plan, al);
    int32_t ia, ib, im;
    loom_ir_node_desc in = {.op = LOOM_IR_OP_INPUT, .dtype = dt, .rank = 2};
    in.shape = (const int64_t[]){sh->m, sh->k};
    if (loom_ir_graph_add(&mm->g, &in, &ia, &d) != LOOM_OK)
        die("building the graph", d.msg);
    in.shape = (const int64_t[]){sh->k, sh->n};
    in.attrs.index = 1;
    if (loom_ir_graph_add(&mm->g, &in, &ib, &d) != LOOM_OK)
        die("building the graph", d.msg);
    loom_ir_node_desc mmd = {.op = LOOM_IR_OP_MATMUL, .n_inputs = 2, .inputs = (int32_t[]){ia, ib}};
    if (loom_ir_graph_add(&mm->g, &mmd, &im, &d) != LOOM_OK ||
        loom_ir_graph_add_output(&mm->g, im, -1) != LOOM_OK ||
        loom_ir_plan_reset(&mm->plan, &mm->g) != LOOM_OK)
        die("building the graph", d.msg);
    int32_t *ids = loom_ir_arena_alloc(&mm->plan.arena, 4 * sizeof(int32_t));
    if (!ids || !loom_ir_grow(&mm->plan.alloc, (void **)&mm->plan.kernels, &mm->plan.cap_kernels, 1,
                              sizeof(loom_ir_kernel)))
        die("out of memory", NULL);
    ids[0] = im, ids[1] = ia, ids[2] = ib, ids[3] = im;
    mm->plan.kernels[0] = (loom_ir_kernel){.kind = LOOM_IR_KERNEL_ROOTED,
                                           .root = im,
                                           .n_nodes = 1,
                                           .nodes = ids,
                                           .n_args = 2,
                                           .args = ids + 1,
                                           .n_results = 1,
                                           .results = ids + 3};
    mm->plan.n_kernels = 1;
    mm->plan.node_kernel[im] = 0;
    loom_cg_options opts = {
        .compile_threads = 1, .dump_dir = getenv("BENCH_DUMP"), .dump_prefix = loom_dtype_name(dt)};
    double t0 = now_s();
    if (loom_cg_compile(&mm->g, &mm->plan, &opts, &mm->code, &mm->k, &d) != LOOM_OK)
        die("compiling the matmul", d.msg);
    mm->compile_ms = (now_s() - t0) * 1e3;
    mm->bufs[0] = a, mm->bufs[1] = b, mm->bufs[2] = c;
    mm->pool = pool;
}

static void loom_mm_destroy(loom_mm *mm) {
    loom_cg_code_destroy(mm->code);
    loom_ir_plan_deinit(&mm->plan);
    loom_ir_graph_deinit(&mm->g);
}

#ifdef LOOM_BENCH_HAVE_DNNL
typedef struct dnnl_mm {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    dnnl_primitive_t prim;
    dnnl_memory_t mem[3];
    char impl[64];
} dnnl_mm;

static void dnnl_check(dnnl_status_t st, const char *what) {
    if (st != dnnl_success)
        die("oneDNN", what);
}

/* false (and nothing to destroy) when oneDNN has no matmul of dt on this CPU (f16 without
 * AVX512-FP16 or AMX-FP16). */
static bool dnnl_mm_build(dnnl_mm *dm, loom_dtype dt, const shape *sh, void *a, void *b, void *c) {
    dnnl_data_type_t t = dt == LOOM_DTYPE_BF16  ? dnnl_bf16
                         : dt == LOOM_DTYPE_F16 ? dnnl_f16
                                                : dnnl_f32;
    dnnl_check(dnnl_engine_create(&dm->engine, dnnl_cpu, 0), "engine");
    dnnl_check(dnnl_stream_create(&dm->stream, dm->engine, dnnl_stream_default_flags), "stream");
    dnnl_memory_desc_t md[3];
    dnnl_dims_t da = {sh->m, sh->k}, db = {sh->k, sh->n}, dc = {sh->m, sh->n};
    dnnl_check(dnnl_memory_desc_init_by_tag(&md[0], 2, da, t, dnnl_ab), "A");
    dnnl_check(dnnl_memory_desc_init_by_tag(&md[1], 2, db, t, dnnl_ab), "B");
    dnnl_check(dnnl_memory_desc_init_by_tag(&md[2], 2, dc, t, dnnl_ab), "C");
    dnnl_matmul_desc_t desc;
    dnnl_check(dnnl_matmul_desc_init(&desc, &md[0], &md[1], NULL, &md[2]), "matmul desc");
    dnnl_primitive_desc_t pd;
    if (dnnl_primitive_desc_create(&pd, &desc, NULL, dm->engine, NULL) != dnnl_success) {
        dnnl_stream_destroy(dm->stream);
        dnnl_engine_destroy(dm->engine);
        return false;
    }
    const char *impl = NULL;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    snprintf(dm->impl, sizeof dm->impl, "%s", impl ? impl : "?");
    dnnl_check(dnnl_primitive_create(&dm->prim, pd), "primitive");
    dnnl_primitive_desc_destroy(pd);
    void *ptr[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        dnnl_check(dnnl_memory_create(&dm->mem[i], &md[i], dm->engine, ptr[i]), "memory");
    return true;
}

static void dnnl_mm_run(void *ud) {
    dnnl_mm *dm = ud;
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, dm->mem[0]}, {DNNL_ARG_WEIGHTS, dm->mem[1]}, {DNNL_ARG_DST, dm->mem[2]}};
    dnnl_check(dnnl_primitive_execute(dm->prim, dm->stream, 3, args), "execute");
    dnnl_check(dnnl_stream_wait(dm->stream), "wait");
}

static void dnnl_mm_destroy(dnnl_mm *dm) {
    for (int i = 0; i < 3; i++)
        dnnl_memory_destroy(dm->mem[i]);
    dnnl_primitive_destroy(dm->prim);
    dnnl_stream_destroy(dm->stream);
    dnnl_engine_destroy(dm->engine);
}
#endif

/* n random values rounded to dt, stored as dt (raw) and as f32 (for the reference). */
static void *random_16(loom_dtype dt, int64_t n, uint64_t seed, float **out_f32) {
    float *f = random_matrix(n, seed);
    void *raw = aligned_alloc(64, ((size_t)n * 2 + 63) / 64 * 64);
    if (!raw)
        die("out of memory", NULL);
    for (int64_t i = 0; i < n; i++) {
        loom_ir_store_f64(raw, dt, i, f[i]);
        f[i] = (float)loom_ir_load_f64(raw, dt, i);
    }
    *out_f32 = f;
    return raw;
}

static void run_16bit(const options *o) {
    const char *dn = loom_dtype_name(o->dtype);
    printf("GEMM %s (f32 accumulation), C = A x B (row-major), GFLOP/s, %s of %d runs (in "
           "turns)\n",
           dn, o->best ? "best" : "median", o->runs);
    char *cpu = LLVMGetHostCPUName();
    const char *isa = getenv("LOOM_MATMUL_ISA");
    printf("host CPU (LLVM): %s; LOOM_MATMUL_ISA=%s\n", cpu, isa ? isa : "(unset: by CPU)");
    LLVMDisposeMessage(cpu);
#ifndef LOOM_BENCH_HAVE_DNNL
    printf("oneDNN: not found at build time; Loom only\n");
#endif
    printf("%-16s %-8s %3s %9s %9s %7s %9s %7s %9s %8s  %s\n", "MxNxK", "", "thr", "Loom", "oneDNN",
           "ratio", "Loom f32", "x f32", "compile", "error", "oneDNN impl");
    loom_allocator sys = loom_allocator_system();
    for (int s = 0; s < o->n_shapes; s++) {
        const shape *sh = &o->shapes[s];
        for (int t = 0; t < o->n_threads; t++) {
            int threads = o->threads[t];
            problem p = {sh->m, sh->n, sh->k, NULL, NULL, NULL, NULL, 1};
            void *a16 = random_16(o->dtype, sh->m * sh->k, 1, &p.a);
            void *b16 = random_16(o->dtype, sh->k * sh->n, 2, &p.b);
            void *c16 = aligned_alloc(64, ((size_t)(sh->m * sh->n) * 2 + 63) / 64 * 64);
            float *c32 = random_matrix(sh->m * sh->n, 3);
            p.c = random_matrix(sh->m * sh->n, 4);
            loom_rt_pool *pool = NULL;
            if (threads > 1 && loom_rt_pool_create(threads, &sys, &pool) != LOOM_OK)
                die("cannot create the thread pool", NULL);
            loom_mm lm, lf;
            loom_mm_build(&lm, &sys, o->dtype, sh, a16, b16, c16, pool);
            loom_mm_build(&lf, &sys, LOOM_DTYPE_F32, sh, p.a, p.b, c32, pool);
            runner rs[3] = {{&p, pool, threads, false, loom_mm_run, &lm},
                            {&p, pool, threads, false, loom_mm_run, &lf},
                            {&p, NULL, threads, false, NULL, NULL}};
            int n = 2;
            const char *impl = "-";
#ifdef LOOM_BENCH_HAVE_DNNL
            dnnl_mm dm;
            void *d16 = aligned_alloc(64, ((size_t)(sh->m * sh->n) * 2 + 63) / 64 * 64);
            omp_set_num_threads(threads); /* before the primitive: it sizes its split */
            bool have_dnnl = dnnl_mm_build(&dm, o->dtype, sh, a16, b16, d16);
            if (have_dnnl) {
                rs[2] = (runner){&p, NULL, threads, false, dnnl_mm_run, &dm};
                n = 3;
                impl = dm.impl;
            } else {
                impl = "oneDNN has no such matmul on this CPU";
            }
#endif
            loom_mm_run(&lm);
            for (int64_t i = 0; i < sh->m * sh->n; i++)
                p.c[i] = (float)loom_ir_load_f64(c16, o->dtype, i);
            double err = check(&p);
            double rate[3] = {0, 0, NAN};
            measure(rs, n, o->runs, o->best, rate);
            char dims[48];
            snprintf(dims, sizeof dims, "%lldx%lldx%lld", (long long)sh->m, (long long)sh->n,
                     (long long)sh->k);
            /* inputs are exact in 16 bits; the output's rounding: 2^-8 (bf16), 2^-11 (f16) */
            double tol = o->dtype == LOOM_DTYPE_BF16 ? 8e-3 : 1e-3;
            printf("%-16s %-8s %3d %9.1f %9.1f %7.2f %9.1f %7.2f %7.1fms %8.1e  %s%s\n", dims,
                   sh->note, threads, rate[0], rate[2], rate[0] / rate[2], rate[1],
                   rate[0] / rate[1], lm.compile_ms, err, impl, err > tol ? "  WRONG" : "");
            fflush(stdout);
#ifdef LOOM_BENCH_HAVE_DNNL
            if (have_dnnl)
                dnnl_mm_destroy(&dm);
            free(d16);
#endif
            loom_mm_destroy(&lm);
            loom_mm_destroy(&lf);
            loom_rt_pool_destroy(pool);
            free(a16), free(b16), free(c16), free(c32), free(p.a), free(p.b), free(p.c);
        }
    }
}

/* ---- main ------------------------------------------------------------------------------- */

static void usage(void) {
    fprintf(stderr,
            "usage: bench_gemm [--runs N] [--best] [--cpu-time] [--threads LIST] [--rows R]\n"
            "                  [--shape MxNxK]... [--o3] [--no-avx512] [--dtype f32|bf16|f16]\n"
            "  --runs N       timed runs per measurement, median reported (default 7, >= 5)\n"
            "  --rows R       rows per kernel call (codegen's row blocks; default M / threads)\n"
            "  --best         report the best run instead of the median (noisy machines)\n"
            "  --cpu-time     time by the thread's CPU time, not wall time (--threads 1 only)\n"
            "  --threads L    comma-separated thread counts (default 1,2)\n"
            "  --shape MxNxK  a shape to run instead of the default set (repeatable)\n"
            "  --o3           LLVM default<O3> instead of TOOLCHAIN.md's cheap pipeline\n"
            "  --no-avx512    compile for the host without AVX-512 (AVX2 register tiles)\n"
            "  --dtype T      bf16, f16: Loom's 16-bit matmuls against oneDNN's (default f32)\n");
    exit(2);
}

static void parse_args(int argc, char **argv, options *o) {
    *o = (options){.runs = 7, .threads = {1, 2}, .n_threads = 2, .dtype = LOOM_DTYPE_F32};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--runs") == 0 && i + 1 < argc) {
            o->runs = atoi(argv[++i]);
            if (o->runs < 1)
                usage();
        } else if (strcmp(a, "--threads") == 0 && i + 1 < argc) {
            o->n_threads = 0;
            for (char *s = argv[++i]; *s && o->n_threads < 4;) {
                o->threads[o->n_threads++] = (int)strtol(s, &s, 10);
                if (*s == ',')
                    s++;
                else if (*s)
                    usage();
            }
            for (int t = 0; t < o->n_threads; t++)
                if (o->threads[t] < 1 || o->threads[t] > 64)
                    usage();
        } else if (strcmp(a, "--shape") == 0 && i + 1 < argc && o->n_shapes < 32) {
            long long m, n, k;
            if (sscanf(argv[++i], "%lldx%lldx%lld", &m, &n, &k) != 3 || m < 1 || n < 1 || k < 1)
                usage();
            o->shapes[o->n_shapes++] = (shape){m, n, k, ""};
        } else if (strcmp(a, "--rows") == 0 && i + 1 < argc) {
            o->rows = atoll(argv[++i]);
            if (o->rows < 1)
                usage();
        } else if (strcmp(a, "--cpu-time") == 0) {
            use_cpu_time = true;
        } else if (strcmp(a, "--best") == 0) {
            o->best = true;
        } else if (strcmp(a, "--o3") == 0) {
            o->o3 = true;
        } else if (strcmp(a, "--no-avx512") == 0) {
            o->no_avx512 = true;
        } else if (strcmp(a, "--dtype") == 0 && i + 1 < argc) {
            const char *t = argv[++i];
            o->dtype = strcmp(t, "bf16") == 0  ? LOOM_DTYPE_BF16
                       : strcmp(t, "f16") == 0 ? LOOM_DTYPE_F16
                       : strcmp(t, "f32") == 0 ? LOOM_DTYPE_F32
                                               : LOOM_DTYPE_COUNT_;
            if (o->dtype == LOOM_DTYPE_COUNT_)
                usage();
        } else {
            usage();
        }
    }
    if (use_cpu_time && (o->n_threads != 1 || o->threads[0] != 1))
        usage(); /* other threads' CPU time is not the caller's */
    if (o->n_shapes == 0) {
        o->n_shapes = (int)(sizeof default_shapes / sizeof default_shapes[0]);
        memcpy(o->shapes, default_shapes, sizeof default_shapes);
    }
}

int main(int argc, char **argv) {
    options o;
    parse_args(argc, argv, &o);
    if (o.no_avx512 && !getenv("LOOM_MATMUL_ISA"))
        setenv("LOOM_MATMUL_ISA", "avx2", 1);
    if (o.dtype != LOOM_DTYPE_F32) {
        run_16bit(&o);
        return 0;
    }
    mlirRegisterAllPasses();
    jit j = {0};
    jit_init(&j, &o);

    char *cpu = LLVMGetHostCPUName();
    printf("GEMM fp32, C = A x B (row-major), GFLOP/s, %s of %d runs (Loom and OpenBLAS "
           "in turns)\n",
           o.best ? "best" : "median", o.runs);
    printf("host CPU (LLVM): %s%s; LLVM pipeline: %s\n", cpu, o.no_avx512 ? " without AVX-512" : "",
           o.o3 ? "default<O3>" : "TOOLCHAIN cheap");
    LLVMDisposeMessage(cpu);
#ifdef LOOM_BENCH_HAVE_OPENBLAS
    printf("OpenBLAS core: %s (OPENBLAS_CORETYPE overrides)\n", openblas_get_corename());
#else
    printf("OpenBLAS: not found at build time; Loom only\n");
#endif
    if (o.rows)
        printf("Loom: the kernel for %lld rows on each row block, the blocks split over T "
               "threads by the runtime's thread pool\n\n",
               (long long)o.rows);
    else
        printf("Loom at T threads: the kernel for M/T rows on T row blocks through the "
               "runtime's thread pool\n");
    printf("codegen: the matmul kernel a training step compiles (codegen/lower_matmul.c: the "
           "schedule, or the FMA microkernel for large matmuls), its own row blocks\n\n");
    printf("%-16s %-8s %3s %9s %9s %9s %7s %7s %9s %8s\n", "MxNxK", "", "thr", "Loom", "codegen",
           "OpenBLAS", "ratio", "cg/BLAS", "compile", "error");

    loom_allocator sys = loom_allocator_system();
    for (int s = 0; s < o.n_shapes; s++) {
        const shape *sh = &o.shapes[s];
        for (int t = 0; t < o.n_threads; t++) {
            int threads = o.threads[t];
            int64_t rows = o.rows ? o.rows : sh->m / threads;
            problem p = {sh->m, sh->n, sh->k, NULL, NULL, NULL, NULL, 0};
            if (o.rows ? sh->m % rows != 0 : sh->m % threads != 0) {
                printf("%lldx%lldx%lld: M not divisible into %s %lld, skipped\n", (long long)sh->m,
                       (long long)sh->n, (long long)sh->k, o.rows ? "blocks of" : "thread count",
                       o.rows ? (long long)rows : threads);
                continue;
            }
            p.parts = sh->m / rows;
            double compile_ms;
            p.half = compile_gemm(&j, rows, sh->n, sh->k, &compile_ms);
            p.a = random_matrix(sh->m * sh->k, 1);
            p.b = random_matrix(sh->k * sh->n, 2);
            p.c = random_matrix(sh->m * sh->n, 3); /* garbage: the kernel must overwrite it */
            loom_rt_pool *pool = NULL;
            if (threads > 1 && loom_rt_pool_create(threads, &sys, &pool) != LOOM_OK)
                die("cannot create the thread pool", NULL);
            float *cc = random_matrix(sh->m * sh->n, 4);
            loom_mm cg;
            loom_mm_build(&cg, &sys, LOOM_DTYPE_F32, sh, p.a, p.b, cc, pool);
            runner rs[3] = {{&p, pool, threads, false, NULL, NULL},
                            {&p, pool, threads, false, loom_mm_run, &cg},
                            {&p, NULL, threads, true, NULL, NULL}};
            run_once(&rs[0]);
            double err = check(&p);
            loom_mm_run(&cg);
            memcpy(p.c, cc, (size_t)(sh->m * sh->n) * sizeof *cc);
            double err_cg = check(&p);
            err = err_cg > err ? err_cg : err;
            double rate[3] = {0, 0, NAN};
#ifdef LOOM_BENCH_HAVE_OPENBLAS
            openblas_set_num_threads(threads);
            measure(rs, 3, o.runs, o.best, rate);
#else
            measure(rs, 2, o.runs, o.best, rate);
#endif
            double loom = rate[0], blas = rate[2];
            char dims[48];
            snprintf(dims, sizeof dims, "%lldx%lldx%lld", (long long)sh->m, (long long)sh->n,
                     (long long)sh->k);
            printf("%-16s %-8s %3d %9.1f %9.1f %9.1f %7.2f %7.2f %7.1fms %8.1e%s\n", dims, sh->note,
                   threads, loom, rate[1], blas, loom / blas, rate[1] / blas, compile_ms, err,
                   err > 1e-5 ? "  WRONG" : "");
            fflush(stdout);
            loom_mm_destroy(&cg);
            free(cc);
            loom_rt_pool_destroy(pool);
            free(p.a);
            free(p.b);
            free(p.c);
        }
    }
    jit_deinit(&j);
    return 0;
}
