/* loom_cg_compile: a plan's kernels become MLIR modules (op builders), lowered by an MLIR
 * pass pipeline to the LLVM dialect, translated to LLVM IR, optimized by a cheap LLVM
 * pipeline and emitted as objects for the host CPU, in parallel threads; the objects then
 * go into one ORC JIT (jit.c).
 *
 * Kernels of one structure (loom_ir_plan_share_kernels) are compiled once: the first of
 * them is, and the others' table entries name its function.
 *
 * From a kernel function to the ABI: each kernel is built as
 *   func.func @loom_kN_body(memref<..>, ..., index lo, index hi)
 * and lowered with use-bare-ptr-memref-call-conv, so every memref becomes one pointer.
 * After translation an LLVM-C wrapper
 *   void loom_kN(void *const *bufs, int64_t lo, int64_t hi)
 * loads the pointers and calls the body, which is internal and alwaysinline, with noalias
 * pointer parameters: plans place a kernel's results over its args only where a result is
 * written in place into a donated input (loom_ir_plan_can_update_in_place), and noalias is
 * what lets the loop vectorizer widen loops without runtime alias checks. The buffers of
 * such an in-place pair (the result and every arg in the input's buffer) are passed as one
 * pointer without noalias instead (param_classes): noalias there would promise LLVM what
 * the plan breaks, and one base pointer lets the vectorizer see that each element is read
 * before it is written at the same index. The body is
 * simplified before it is inlined: the inliner turns noalias into scope metadata only for
 * accesses whose base pointer it can see, and before instcombine those hide in memref
 * descriptors (measured: the alias checks stayed and chains ran 3x slower). Inlined, each
 * kernel is one function for codegen, whose cost is mostly per function; globaldce drops
 * the body, so nothing is compiled twice (TOOLCHAIN.md: -43%).
 *
 * LLVM pipeline (TOOLCHAIN.md's measured choice, LICM matters for reductions, plus the
 * pre-inlining cleanup):
 *   function(sroa, early-cse, instcombine), always-inline, globaldce,
 *   function(sroa, early-cse, instcombine, simplifycfg, loop-mssa(loop-rotate, licm),
 *            loop-vectorize, instcombine, simplifycfg)
 * (every instcombine without its fixpoint verification, which aborts: see below)
 * with the target triple, data layout, CPU and feature string of the host (detected at run
 * time), codegen at the default level without loop strength reduction (host_target.c), PIC,
 * small code model. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Core.h>
#include <llvm-c/DebugInfo.h>
#include <llvm-c/Error.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <mlir-c/Diagnostics.h>
#include <mlir-c/Pass.h>
#include <mlir-c/RegisterEverything.h>
#include <mlir-c/Target/LLVMIR.h>

#include "cg_internal.h"
#include "matmul_schedule.h"
#include "runtime/trace.h"

static const char *const mlir_pipeline =
    "builtin.module(convert-scf-to-cf,convert-vector-to-llvm,convert-math-to-llvm,"
    "convert-arith-to-llvm,"
    "finalize-memref-to-llvm,convert-func-to-llvm{use-bare-ptr-memref-call-conv=1},"
    "convert-cf-to-llvm,reconcile-unrealized-casts)";
/* modules holding linalg matmuls (and what the matmul schedule leaves: vector ops, affine
 * maps, strided views) */
static const char *const mlir_pipeline_linalg =
    "builtin.module(func.func(convert-linalg-to-loops),convert-vector-to-scf,"
    "expand-strided-metadata,lower-affine,convert-scf-to-cf,convert-vector-to-llvm,"
    "convert-math-to-llvm,convert-arith-to-llvm,finalize-memref-to-llvm,"
    "convert-func-to-llvm{use-bare-ptr-memref-call-conv=1},convert-cf-to-llvm,"
    "reconcile-unrealized-casts)";
/* instcombine<no-verify-fixpoint>: a plain "instcombine" in a textual pipeline checks that
 * one iteration reached a fixpoint and aborts the process when it did not (LLVM 19; its own
 * O2 pipeline turns the check off, and so must we). */
static const char *const llvm_pipeline =
    "function(sroa,early-cse,instcombine<no-verify-fixpoint>),always-inline,globaldce,"
    "function(sroa,early-cse,instcombine<no-verify-fixpoint>,simplifycfg,"
    "loop-mssa(loop-rotate,licm),loop-vectorize,instcombine<no-verify-fixpoint>,simplifycfg)";

enum { DUMP_MLIR, DUMP_LOWERED, DUMP_LL, DUMP_ASM, DUMP_COUNT_ };
static const char *const dump_ext[DUMP_COUNT_] = {".mlir", ".lowered.mlir", ".ll", ".s"};
enum {
    MAX_WORKERS = 64,         /* compile threads */
    MODULES_PER_WORKER = 8,   /* at most; of about equal compile time, taken in turn */
    MODULE_MIN_COST = 50,     /* compile_cost units (~ms): a module costs ~3 ms of its own */
    WORKER_STACK = 256 << 20, /* reserved, touched only as deep as a kernel's fused chain */
};

/* LOOM_CG_TIMING=1: per-phase wall time summed over modules (and over compiles running at
 * the same time), printed to stderr after each compile. A debugging aid. */
enum { T_BUILD, T_SCHEDULE, T_MLIR_PASSES, T_TRANSLATE, T_LLVM_PASSES, T_EMIT, T_JIT, T_COUNT_ };
static const char *const phase_name[T_COUNT_] = {"build+verify", "matmul schedule", "MLIR passes",
                                                 "translate",    "LLVM passes",     "emit object",
                                                 "JIT load"};
static _Atomic int64_t phase_ns[T_COUNT_];

static void phase_add(int phase, int64_t t0) {
    atomic_fetch_add(&phase_ns[phase], loom_rt_now_ns() - t0);
}
/* A module: a contiguous range of the kernels to compile (compile_state.order) compiled
 * together by one thread. */
typedef struct job {
    int32_t first, count; /* into compile_state.order */
    uint8_t *obj;         /* object file bytes (the shared allocator) */
    size_t obj_len;
    loom_status st;
    loom_ir_diag d;
    loom_ir_sbuf dump[DUMP_COUNT_];
} job;

typedef struct compile_state {
    const loom_ir_graph *g;
    const loom_ir_plan *plan;
    const int32_t *order; /* the kernels to compile: one of each structure, no collectives */
    bool dumping;
    pthread_mutex_t mu;
    loom_allocator inner;  /* the graph's allocator */
    loom_allocator shared; /* inner behind mu: the user's allocator need not be thread-safe */
    job *jobs;
    int32_t n_jobs;
    atomic_int next;
    atomic_bool failed;
    struct loom_rt_trace *trace; /* NULL: not tracing */
} compile_state;

static void *locked_alloc(void *ud, void *ptr, size_t old_size, size_t new_size) {
    compile_state *cs = ud;
    pthread_mutex_lock(&cs->mu);
    void *p = cs->inner.fn(cs->inner.ud, ptr, old_size, new_size);
    pthread_mutex_unlock(&cs->mu);
    return p;
}

/* Per-thread compiler: its own MLIR context, LLVM context and target machine. */
typedef struct worker {
    compile_state *cs;
    MlirContext ctx;
    MlirPassManager pm[2]; /* basic, linalg; created on first use */
    LLVMContextRef lctx;
    LLVMTargetMachineRef tm;
    cg_scratch *scratch;
    bool all_dialects; /* every registered dialect loaded (the matmul schedule needs them) */
    char diag[400];    /* MLIR's last error */
} worker;

static void diag_append(MlirStringRef s, void *ud) {
    worker *w = ud;
    size_t n = strlen(w->diag);
    size_t room = sizeof w->diag - 1 - n;
    size_t k = s.length < room ? s.length : room;
    memcpy(w->diag + n, s.data, k);
    w->diag[n + k] = '\0';
}

static MlirLogicalResult on_diagnostic(MlirDiagnostic diag, void *ud) {
    worker *w = ud;
    if (mlirDiagnosticGetSeverity(diag) == MlirDiagnosticError && w->diag[0] == '\0')
        mlirDiagnosticPrint(diag, diag_append, w);
    return mlirLogicalResultSuccess();
}

static loom_status worker_init(worker *w, compile_state *cs, loom_ir_diag *d) {
    memset(w, 0, sizeof *w);
    w->cs = cs;
    w->ctx = mlirContextCreateWithThreading(false);
    MlirDialectRegistry reg = mlirDialectRegistryCreate();
    mlirRegisterAllDialects(reg);
    mlirContextAppendDialectRegistry(w->ctx, reg);
    mlirDialectRegistryDestroy(reg);
    /* load only what the builders use; passes load their own dependent dialects */
    static const char *const dialects[] = {"func", "arith",  "math",  "memref",
                                           "scf",  "linalg", "vector"};
    for (size_t i = 0; i < sizeof dialects / sizeof dialects[0]; i++)
        mlirContextGetOrLoadDialect(w->ctx, mlirStringRefCreateFromCString(dialects[i]));
    mlirRegisterAllLLVMTranslations(w->ctx);
    mlirContextAttachDiagnosticHandler(w->ctx, on_diagnostic, w, NULL);
    w->lctx = LLVMContextCreate();
    loom_status st = loom_cg_host_target_machine_create(&w->tm, d);
    if (st != LOOM_OK)
        return st;
    if (loom_cg_scratch_create(cs->g, &cs->shared, &w->scratch) != LOOM_OK)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "codegen: out of memory");
    return LOOM_OK;
}

static void worker_deinit(worker *w) {
    loom_cg_scratch_destroy(w->scratch);
    if (w->tm)
        LLVMDisposeTargetMachine(w->tm);
    if (w->lctx)
        LLVMContextDispose(w->lctx);
    for (int i = 0; i < 2; i++)
        if (!mlirPassManagerIsNull(w->pm[i]))
            mlirPassManagerDestroy(w->pm[i]);
    if (!mlirContextIsNull(w->ctx))
        mlirContextDestroy(w->ctx);
}

/* A kernel's compile time in rough units: ms on a Zen 5 core, measured kernel by kernel on
 * ResNet-50's bf16 step (LOOM_TRACE's compile events with one kernel a module). The
 * convolutions' microkernels dominate; a strided input gradient computes stride^2 phases. */
static int32_t compile_cost(const loom_ir_graph *g, const loom_ir_plan *plan, int32_t k) {
    const loom_ir_kernel *kr = &plan->kernels[k];
    if (kr->kind != LOOM_IR_KERNEL_ROOTED)
        return 4 + kr->n_nodes / 4;
    const loom_ir_node *root = &g->nodes[kr->root];
    if (root->op == LOOM_IR_OP_CONV2D)
        return 30;
    if (root->op == LOOM_IR_OP_CONV2D_GRAD_WEIGHT)
        return 85;
    if (root->op == LOOM_IR_OP_CONV2D_GRAD_INPUT) {
        int64_t phases = (int64_t)root->attrs.conv.stride[0] * root->attrs.conv.stride[1];
        return phases > 1 ? (int32_t)(phases < 8 ? 28 * phases : 224) : 55;
    }
    return 20; /* matmuls, pools */
}

/* Splits cs->order into cs->n_jobs contiguous modules of about equal compile cost, each of
 * at least one kernel: a module ends where one more kernel would take it further from its
 * share of what is left. Equal modules keep both threads busy to the end, where an equal
 * count of kernels left one thread compiling backward's convolutions alone for a second. */
static void split_modules(compile_state *cs, int32_t n_order, int64_t cost) {
    int64_t left = cost;
    int32_t i = 0;
    for (int32_t j = 0; j < cs->n_jobs; j++) {
        int32_t later = cs->n_jobs - j - 1; /* modules after this one, a kernel each at least */
        int64_t share = left / (later + 1), c = 0;
        cs->jobs[j].first = i;
        do
            c += compile_cost(cs->g, cs->plan, cs->order[i++]);
        while (i < n_order - later &&
               (later == 0 || c + compile_cost(cs->g, cs->plan, cs->order[i]) / 2 <= share));
        cs->jobs[j].count = i - cs->jobs[j].first;
        left -= c;
    }
}

/* The plan's number of job's first and last kernels. */
static int32_t first_kernel(const compile_state *cs, const job *jb) {
    return cs->order[jb->first];
}
static int32_t last_kernel(const compile_state *cs, const job *jb) {
    return cs->order[jb->first + jb->count - 1];
}

static loom_status mlir_failed(worker *w, job *jb, const char *what) {
    return loom_ir_diag_set(&jb->d, LOOM_STATUS_INTERNAL,
                            "codegen: %s failed for kernels %d..%d: %s", what,
                            (int)first_kernel(w->cs, jb), (int)last_kernel(w->cs, jb),
                            w->diag[0] ? w->diag : "(no diagnostic)");
}

static void pipeline_error(MlirStringRef s, void *ud) {
    diag_append(s, ud);
}

static MlirPassManager get_pm(worker *w, int which) {
    if (mlirPassManagerIsNull(w->pm[which])) {
        MlirPassManager pm = mlirPassManagerCreate(w->ctx);
        const char *p = which ? mlir_pipeline_linalg : mlir_pipeline;
        if (mlirLogicalResultIsFailure(mlirParsePassPipeline(mlirPassManagerGetAsOpPassManager(pm),
                                                             mlirStringRefCreateFromCString(p),
                                                             pipeline_error, w))) {
            mlirPassManagerDestroy(pm);
            return (MlirPassManager){NULL};
        }
        /* The pass manager verifies the module after every pass: 45% of the MLIR passes'
         * time (a bf16 ResNet-50 step: 1.7-1.9 -> 0.8-1.1 s of the compile threads'). Their
         * input is verified when built (build_module) and their output as LLVM IR when
         * translated (mlirTranslateModuleToLLVMIR); LOOM_CG_VERIFY=1 verifies every pass's. */
        const char *verify = getenv("LOOM_CG_VERIFY");
        mlirPassManagerEnableVerifier(pm, verify && verify[0] == '1');
        w->pm[which] = pm;
    }
    return w->pm[which];
}

/* Builds the MLIR module of job's kernels. */
static loom_status build_module(worker *w, job *jb, bool use_linalg, MlirModule *out,
                                bool *out_has_linalg) {
    compile_state *cs = w->cs;
    MlirModule module = mlirModuleCreateEmpty(mlirLocationUnknownGet(w->ctx));
    cg_b b;
    cg_b_init(&b, w->ctx, module);
    *out_has_linalg = false;
    loom_status st = LOOM_OK;
    for (int32_t i = 0; i < jb->count && st == LOOM_OK; i++) {
        int32_t k = cs->order[jb->first + i];
        char name[48];
        snprintf(name, sizeof name, "loom_k%d_body", (int)k);
        bool lin = use_linalg && loom_cg_kernel_uses_linalg(cs->g, cs->plan, k);
        *out_has_linalg |= lin;
        st = loom_cg_kernel_emit(&b, cs->g, cs->plan, k, name, lin, w->scratch, &jb->d);
    }
    if (st == LOOM_OK && !mlirOperationVerify(mlirModuleGetOperation(module)))
        st = mlir_failed(w, jb, "verifying the kernels' MLIR");
    if (st != LOOM_OK) {
        mlirModuleDestroy(module);
        return st;
    }
    *out = module;
    return LOOM_OK;
}

/* MLIR module -> LLVM dialect (dumps before and after), trying the matmul schedule first. */
static loom_status lower_module(worker *w, job *jb, MlirModule *module, bool *has_linalg) {
    if (*has_linalg) {
        loom_ir_diag sd;
        loom_ir_diag_init(&sd);
        int64_t t0 = loom_rt_now_ns();
        if (!w->all_dialects) { /* transform, vector, ... : once per thread, ~2 ms */
            mlirContextLoadAllAvailableDialects(w->ctx);
            w->all_dialects = true;
        }
        loom_status sst = loom_cg_schedule_matmuls(*module, &sd);
        phase_add(T_SCHEDULE, t0);
        if (sst != LOOM_OK) {
            /* the schedule could not handle these shapes: plain loops instead */
            const char *timing = getenv("LOOM_CG_TIMING");
            if (timing && timing[0] == '1')
                fprintf(stderr, "codegen: matmul schedule failed, using loops: %s\n", sd.msg);
            mlirModuleDestroy(*module);
            *module = (MlirModule){NULL};
            w->diag[0] = '\0';
            loom_status st = build_module(w, jb, false, module, has_linalg);
            if (st != LOOM_OK)
                return st;
        }
    }
    MlirPassManager pm = get_pm(w, *has_linalg ? 1 : 0);
    if (mlirPassManagerIsNull(pm))
        return mlir_failed(w, jb, "parsing the MLIR pass pipeline");
    int64_t t0 = loom_rt_now_ns();
    bool failed =
        mlirLogicalResultIsFailure(mlirPassManagerRunOnOp(pm, mlirModuleGetOperation(*module)));
    phase_add(T_MLIR_PASSES, t0);
    if (failed)
        return mlir_failed(w, jb, "lowering to the LLVM dialect");
    if (w->cs->dumping)
        mlirOperationPrint(mlirModuleGetOperation(*module), cg_print_to_sbuf,
                           &jb->dump[DUMP_LOWERED]);
    return LOOM_OK;
}

/* Loop-carried float adds (a phi fed back by the add itself) are reductions Loom emitted on
 * purpose: allow their reassociation so the vectorizer keeps several partial sums. */
static void mark_reductions(LLVMValueRef fn) {
    for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(fn); bb; bb = LLVMGetNextBasicBlock(bb))
        for (LLVMValueRef in = LLVMGetFirstInstruction(bb); in; in = LLVMGetNextInstruction(in)) {
            if (LLVMGetInstructionOpcode(in) != LLVMFAdd)
                continue;
            for (unsigned o = 0; o < 2; o++) {
                LLVMValueRef phi = LLVMGetOperand(in, o);
                if (!LLVMIsAPHINode(phi))
                    continue;
                for (unsigned i = 0; i < LLVMCountIncoming(phi); i++)
                    if (LLVMGetIncomingValue(phi, i) == in)
                        LLVMSetFastMathFlags(in, LLVMFastMathAllowReassoc);
            }
        }
}

/* Innermost loops get `llvm.loop.interleave.count`: LLVM does not interleave loops with
 * large bodies, and a fused chain of transcendental functions then runs one dependent chain
 * of ~1000 instructions per vector, bound by latency (measured: 64 ops of exp/mul over 16M
 * floats took 38 ns per element; see the report for the interleaved figure). Loops come
 * from scf.for in block order, so a branch to an earlier (or the same) block is a back
 * edge from latch to header, and a loop is innermost when no other back edge lies within
 * it. Only bodies with INTERLEAVE_MIN_WORK floating-point operations or more are marked
 * (a 64-op chain, a handful of exps): short ones are not latency-bound and LLVM picks well
 * for them. */
enum { INTERLEAVE = 4, INTERLEAVE_MIN_WORK = 48 };

/* Floating-point work: arithmetic, compares, selects and intrinsic calls (fma, sqrt, ...). */
static bool is_fp_work(LLVMValueRef in) {
    LLVMOpcode op = LLVMGetInstructionOpcode(in); /* LLVM's enum: no exhaustive switch */
    return op == LLVMFAdd || op == LLVMFSub || op == LLVMFMul || op == LLVMFDiv || op == LLVMFNeg ||
           op == LLVMFCmp || op == LLVMSelect || op == LLVMCall;
}

static void mark_inner_loops(LLVMContextRef lctx, LLVMValueRef fn) {
    unsigned n = LLVMCountBasicBlocks(fn);
    if (n < 2 || n > 4096)
        return;
    LLVMBasicBlockRef blocks[4096];
    LLVMGetBasicBlocks(fn, blocks);
    int32_t head[4096];
    for (unsigned i = 0; i < n; i++) {
        head[i] = -1;
        LLVMValueRef term = LLVMGetBasicBlockTerminator(blocks[i]);
        if (!term)
            continue;
        for (unsigned s = 0; s < LLVMGetNumSuccessors(term); s++) {
            LLVMBasicBlockRef succ = LLVMGetSuccessor(term, s);
            for (unsigned j = 0; j <= i; j++)
                if (blocks[j] == succ)
                    head[i] = (int32_t)j;
        }
    }
    unsigned kind = LLVMGetMDKindIDInContext(lctx, "llvm.loop", 9);
    LLVMTypeRef i32 = LLVMInt32TypeInContext(lctx);
    for (unsigned i = 0; i < n; i++) {
        if (head[i] < 0)
            continue;
        bool inner = true;
        for (unsigned k = (unsigned)head[i]; k < i && inner; k++)
            inner = head[k] < 0 || head[k] < head[i];
        /* short chains: LLVM's own choice (forcing 4 x 16 lanes would leave short loops to
         * the scalar remainder, and costs compile time) */
        unsigned work = 0;
        for (unsigned k = (unsigned)head[i]; k <= i; k++)
            for (LLVMValueRef in = LLVMGetFirstInstruction(blocks[k]); in;
                 in = LLVMGetNextInstruction(in))
                work += is_fp_work(in);
        if (!inner || work < INTERLEAVE_MIN_WORK)
            continue;
        LLVMMetadataRef tmp = LLVMTemporaryMDNode(lctx, NULL, 0);
        LLVMMetadataRef pair[2] = {
            LLVMMDStringInContext2(lctx, "llvm.loop.interleave.count", 26),
            LLVMValueAsMetadata(LLVMConstInt(i32, INTERLEAVE, 0)),
        };
        LLVMMetadataRef ops[2] = {tmp, LLVMMDNodeInContext2(lctx, pair, 2)};
        LLVMMetadataRef id = LLVMMDNodeInContext2(lctx, ops, 2);
        LLVMMetadataReplaceAllUsesWith(tmp, id);
        LLVMSetMetadata(LLVMGetBasicBlockTerminator(blocks[i]), kind,
                        LLVMMetadataAsValue(lctx, id));
    }
}

static void add_fn_attr(LLVMContextRef lctx, LLVMValueRef fn, LLVMAttributeIndex idx,
                        const char *name) {
    unsigned kind = LLVMGetEnumAttributeKindForName(name, strlen(name));
    LLVMAddAttributeAtIndex(fn, idx, LLVMCreateEnumAttribute(lctx, kind, 0));
}

static int32_t plan_params(const loom_ir_plan *plan, int32_t k) {
    return plan->kernels[k].n_args + plan->kernels[k].n_results;
}

/* The buffer a kernel's arg or result lives in, for telling which of them share one: a
 * graph output donated into an input is that input's buffer (the caller passes the same). */
static void buffer_of(const loom_ir_graph *g, const loom_ir_plan *plan, int32_t node,
                      int32_t *out_kind, int64_t *out_where) {
    if (!plan->has_placement || !plan->placement || !plan->has_placement[node]) {
        *out_kind = -1; /* not placed (a plan that only fuses): a buffer of its own */
        *out_where = node;
        return;
    }
    const loom_ir_placement *pl = &plan->placement[node];
    *out_kind = (int32_t)pl->kind;
    *out_where = pl->kind == LOOM_IR_BUFFER_ARENA ? (int64_t)pl->offset : pl->index;
    if (pl->kind == LOOM_IR_BUFFER_OUTPUT && pl->index >= 0 && pl->index < g->n_outputs &&
        g->outputs[pl->index].alias >= 0) {
        *out_kind = LOOM_IR_BUFFER_INPUT;
        *out_where = g->outputs[pl->index].alias;
    }
}

/* Kernel k's pointer parameters (its args, then its results) by buffer: cls[p] is the first
 * parameter in p's buffer when that buffer is also written through another parameter (an
 * in-place update), else p itself. At most max parameters; false when k has more. */
static bool param_classes(const loom_ir_graph *g, const loom_ir_plan *plan, int32_t k, int32_t *cls,
                          int32_t max) {
    const loom_ir_kernel *kn = &plan->kernels[k];
    int32_t n = kn->n_args + kn->n_results;
    if (n > max)
        return false;
    int32_t kinds[2048];
    int64_t where[2048];
    for (int32_t p = 0; p < n; p++) {
        cls[p] = p;
        int32_t node = p < kn->n_args ? kn->args[p] : kn->results[p - kn->n_args];
        buffer_of(g, plan, node, &kinds[p], &where[p]);
    }
    for (int32_t p = 0; p < n; p++) {
        int32_t first = p;
        bool written = p >= kn->n_args, shared = false;
        for (int32_t q = 0; q < n; q++)
            if (q != p && kinds[q] == kinds[p] && where[q] == where[p]) {
                shared = true;
                written = written || q >= kn->n_args;
                first = q < first ? q : first;
            }
        if (shared && written)
            cls[p] = first;
    }
    return true;
}

/* Makes each body internal, its pointers noalias (but in-place pairs'), and adds the ABI
 * wrapper. */
static loom_status add_wrappers(worker *w, job *jb, LLVMModuleRef mod) {
    LLVMContextRef lctx = w->lctx;
    LLVMTypeRef ptr = LLVMPointerTypeInContext(lctx, 0);
    LLVMTypeRef i64 = LLVMInt64TypeInContext(lctx);
    LLVMTypeRef params[3] = {ptr, i64, i64};
    LLVMTypeRef wty = LLVMFunctionType(LLVMVoidTypeInContext(lctx), params, 3, 0);
    LLVMBuilderRef bld = LLVMCreateBuilderInContext(lctx);
    loom_status st = LOOM_OK;
    for (int32_t i = 0; i < jb->count && st == LOOM_OK; i++) {
        int32_t k = w->cs->order[jb->first + i];
        char name[48];
        snprintf(name, sizeof name, "loom_k%d_body", (int)k);
        LLVMValueRef body = LLVMGetNamedFunction(mod, name);
        if (!body) {
            st = loom_ir_diag_set(&jb->d, LOOM_STATUS_INTERNAL, "codegen: %s vanished", name);
            break;
        }
        mark_reductions(body);
        mark_inner_loops(lctx, body);
        LLVMSetLinkage(body, LLVMInternalLinkage);
        add_fn_attr(lctx, body, LLVMAttributeFunctionIndex, "alwaysinline");
        add_fn_attr(lctx, body, LLVMAttributeFunctionIndex, "nounwind");
        unsigned np = LLVMCountParams(body);
        LLVMTypeRef bty = LLVMGlobalGetValueType(body);
        LLVMValueRef args[2 * 1024 + 2];
        if (np < 2 || np > 2 * 1024 + 2) {
            st = loom_ir_diag_set(&jb->d, LOOM_STATUS_INTERNAL, "codegen: %s has %u params", name,
                                  np);
            break;
        }
        int32_t cls[2048];
        if (!param_classes(w->cs->g, w->cs->plan, k, cls, 2048) ||
            (int32_t)np != plan_params(w->cs->plan, k) + 2) {
            st = loom_ir_diag_set(&jb->d, LOOM_STATUS_INTERNAL,
                                  "codegen: %s has %u params, its kernel %d buffers", name, np,
                                  (int)plan_params(w->cs->plan, k));
            break;
        }
        for (unsigned p = 0; p + 2 < np; p++) {
            bool in_place = cls[p] != (int32_t)p;
            for (unsigned q = p + 1; q + 2 < np && !in_place; q++)
                in_place = cls[q] == (int32_t)p;
            if (!in_place)
                add_fn_attr(lctx, body, p + 1, "noalias");
        }
        snprintf(name, sizeof name, "loom_k%d", (int)k);
        LLVMValueRef fn = LLVMAddFunction(mod, name, wty);
        add_fn_attr(lctx, fn, LLVMAttributeFunctionIndex, "nounwind");
        LLVMPositionBuilderAtEnd(bld, LLVMAppendBasicBlockInContext(lctx, fn, "entry"));
        LLVMValueRef bufs = LLVMGetParam(fn, 0);
        for (unsigned p = 0; p + 2 < np; p++) {
            if (cls[p] != (int32_t)p) { /* the same buffer as an earlier parameter */
                args[p] = args[cls[p]];
                continue;
            }
            LLVMValueRef idx = LLVMConstInt(i64, p, 0);
            LLVMValueRef slot = LLVMBuildGEP2(bld, ptr, bufs, &idx, 1, "");
            args[p] = LLVMBuildLoad2(bld, ptr, slot, "");
        }
        args[np - 2] = LLVMGetParam(fn, 1);
        args[np - 1] = LLVMGetParam(fn, 2);
        LLVMBuildCall2(bld, bty, body, args, np, "");
        LLVMBuildRetVoid(bld);
    }
    LLVMDisposeBuilder(bld);
    return st;
}

static loom_status llvm_error(const compile_state *cs, job *jb, const char *what, char *msg) {
    return loom_ir_diag_set(&jb->d, LOOM_STATUS_INTERNAL,
                            "codegen: %s failed for kernels %d..%d: %s", what,
                            (int)first_kernel(cs, jb), (int)last_kernel(cs, jb), msg ? msg : "?");
}

static loom_status compile_job(worker *w, job *jb) {
    compile_state *cs = w->cs;
    w->diag[0] = '\0';
    MlirModule module;
    bool has_linalg;
    int64_t t0 = loom_rt_now_ns();
    loom_status st = build_module(w, jb, true, &module, &has_linalg);
    phase_add(T_BUILD, t0);
    if (st != LOOM_OK)
        return st;
    if (cs->dumping)
        mlirOperationPrint(mlirModuleGetOperation(module), cg_print_to_sbuf, &jb->dump[DUMP_MLIR]);
    st = lower_module(w, jb, &module, &has_linalg);
    LLVMModuleRef mod = NULL;
    t0 = loom_rt_now_ns();
    if (st == LOOM_OK) {
        mod = mlirTranslateModuleToLLVMIR(mlirModuleGetOperation(module), w->lctx);
        if (!mod)
            st = mlir_failed(w, jb, "translating to LLVM IR");
    }
    if (!mlirModuleIsNull(module))
        mlirModuleDestroy(module);
    phase_add(T_TRANSLATE, t0);
    if (st != LOOM_OK)
        return st;
    st = add_wrappers(w, jb, mod);
    if (st == LOOM_OK) {
        LLVMSetTarget(mod, loom_cg_host_triple());
        LLVMTargetDataRef dl = LLVMCreateTargetDataLayout(w->tm);
        LLVMSetModuleDataLayout(mod, dl);
        LLVMDisposeTargetData(dl);
        LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
        t0 = loom_rt_now_ns();
        LLVMErrorRef err = LLVMRunPasses(mod, llvm_pipeline, w->tm, po);
        phase_add(T_LLVM_PASSES, t0);
        LLVMDisposePassBuilderOptions(po);
        if (err) {
            char *msg = LLVMGetErrorMessage(err);
            st = llvm_error(cs, jb, "the LLVM pipeline", msg);
            LLVMDisposeErrorMessage(msg);
        }
    }
    if (st == LOOM_OK && cs->dumping) {
        char *text = LLVMPrintModuleToString(mod);
        loom_ir_sbuf_append(&jb->dump[DUMP_LL], text, strlen(text));
        LLVMDisposeMessage(text);
        char *msg = NULL;
        LLVMMemoryBufferRef asmbuf = NULL;
        if (!LLVMTargetMachineEmitToMemoryBuffer(w->tm, mod, LLVMAssemblyFile, &msg, &asmbuf)) {
            loom_ir_sbuf_append(&jb->dump[DUMP_ASM], LLVMGetBufferStart(asmbuf),
                                LLVMGetBufferSize(asmbuf));
            LLVMDisposeMemoryBuffer(asmbuf);
        } else {
            LLVMDisposeMessage(msg);
        }
    }
    if (st == LOOM_OK) {
        char *msg = NULL;
        LLVMMemoryBufferRef obj = NULL;
        t0 = loom_rt_now_ns();
        LLVMBool failed =
            LLVMTargetMachineEmitToMemoryBuffer(w->tm, mod, LLVMObjectFile, &msg, &obj);
        phase_add(T_EMIT, t0);
        if (failed) {
            st = llvm_error(cs, jb, "emitting an object", msg);
            LLVMDisposeMessage(msg);
        } else {
            size_t n = LLVMGetBufferSize(obj);
            jb->obj = loom_ir_alloc(&cs->shared, n ? n : 1);
            if (!jb->obj)
                st = loom_ir_diag_set(&jb->d, LOOM_STATUS_OUT_OF_MEMORY,
                                      "codegen: out of memory keeping a %zu-byte object", n);
            else {
                memcpy(jb->obj, LLVMGetBufferStart(obj), n);
                jb->obj_len = n;
            }
            LLVMDisposeMemoryBuffer(obj);
        }
    }
    LLVMDisposeModule(mod);
    return st;
}

static void run_worker(compile_state *cs) {
    worker w;
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_status init = worker_init(&w, cs, &d);
    for (;;) {
        int i = atomic_fetch_add(&cs->next, 1);
        if (i >= cs->n_jobs)
            break;
        job *jb = &cs->jobs[i];
        if (atomic_load(&cs->failed)) {
            jb->st = LOOM_STATUS_INTERNAL; /* not reported: an earlier job's error is */
            continue;
        }
        if (init != LOOM_OK) {
            jb->d = d;
            jb->st = init;
        } else {
            int64_t t0 = loom_rt_now_ns();
            jb->st = compile_job(&w, jb);
            if (cs->trace) {
                char name[64];
                snprintf(name, sizeof name, "module %d: kernels %d..%d", i,
                         (int)first_kernel(cs, jb), (int)last_kernel(cs, jb));
                loom_rt_trace_event(cs->trace, "compile", name, t0, loom_rt_now_ns(), NULL);
            }
        }
        if (jb->st != LOOM_OK)
            atomic_store(&cs->failed, true);
    }
    worker_deinit(&w);
}

static void *worker_main(void *ud) {
    run_worker(ud);
    return NULL;
}

/* Runs fn(arg) on a thread with a WORKER_STACK stack (evaluation recurses once per fused
 * node; the caller's thread may have a small stack), or inline if no thread starts. */
static void run_on_big_stack(void *(*fn)(void *), void *arg) {
    pthread_attr_t attr;
    pthread_t tid;
    bool started = false;
    if (pthread_attr_init(&attr) == 0) {
        pthread_attr_setstacksize(&attr, WORKER_STACK);
        started = pthread_create(&tid, &attr, fn, arg) == 0;
        pthread_attr_destroy(&attr);
    }
    if (started)
        pthread_join(tid, NULL);
    else
        fn(arg);
}

typedef struct check_job {
    const loom_ir_graph *g;
    const loom_ir_plan *plan;
    cg_kernel_rec *recs;
    loom_ir_diag *d;
    loom_status st;
} check_job;

static void *check_main(void *ud) {
    check_job *cj = ud;
    const loom_allocator *a = &cj->g->alloc;
    cg_scratch *scratch = NULL;
    cj->st = loom_cg_scratch_create(cj->g, a, &scratch);
    if (cj->st != LOOM_OK)
        cj->st = loom_ir_diag_set(cj->d, cj->st, "codegen: out of memory");
    for (int32_t k = 0; k < cj->plan->n_kernels && cj->st == LOOM_OK; k++) {
        cg_kernel_rec *r = &cj->recs[k];
        if (cj->plan->kernels[k].kind == LOOM_IR_KERNEL_COLLECTIVE) {
            r->extent = r->grain = 1; /* no code: the runtime runs it (an empty name) */
            continue;
        }
        snprintf(r->name, sizeof r->name, "loom_k%d", (int)k);
        cj->st = loom_cg_kernel_check(cj->g, cj->plan, k, scratch, &r->extent, &r->grain, cj->d);
    }
    loom_cg_scratch_destroy(scratch);
    return NULL;
}

static loom_status write_dumps(const compile_state *cs, const loom_cg_options *opts,
                               loom_ir_diag *d) {
    const loom_allocator *a = &cs->inner;
    loom_ir_sbuf path, all;
    loom_ir_sbuf_init(&path, a);
    loom_ir_sbuf_init(&all, a);
    loom_status st = LOOM_OK;
    const char *prefix = opts->dump_prefix ? opts->dump_prefix : "kernels";
    /* MLIR: one file holding every module (mlir-opt reads several top-level modules). LLVM
     * IR and assembly: a file per module (<prefix>.mJ.ll, .mJ.s), as opt, llc and as take
     * one module each. */
    for (int f = 0; f < DUMP_COUNT_ && st == LOOM_OK; f++) {
        bool per_module = f == DUMP_LL || f == DUMP_ASM;
        for (int32_t j0 = 0; j0 < (per_module ? cs->n_jobs : 1) && st == LOOM_OK; j0++) {
            all.len = 0;
            for (int32_t j = j0; j < (per_module ? j0 + 1 : cs->n_jobs); j++) {
                const job *jb = &cs->jobs[j];
                const char *c = f == DUMP_LL ? ";" : f == DUMP_ASM ? "#" : "//";
                loom_ir_sbuf_printf(&all, "%s module %d: kernels %d..%d\n", c, (int)j,
                                    (int)first_kernel(cs, jb), (int)last_kernel(cs, jb));
                if (jb->dump[f].len)
                    loom_ir_sbuf_append(&all, jb->dump[f].data, jb->dump[f].len);
                loom_ir_sbuf_append(&all, "\n", 1);
            }
            path.len = 0;
            if (per_module)
                loom_ir_sbuf_printf(&path, "%s/%s.m%d%s", opts->dump_dir, prefix, (int)j0,
                                    dump_ext[f]);
            else
                loom_ir_sbuf_printf(&path, "%s/%s%s", opts->dump_dir, prefix, dump_ext[f]);
            if (path.oom || all.oom)
                st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY,
                                      "codegen: out of memory dumping");
            else
                st = loom_ir_write_file_atomic(path.data, all.data, all.len, d);
        }
    }
    loom_ir_sbuf_deinit(&path);
    loom_ir_sbuf_deinit(&all);
    return st;
}

static loom_status check_args(const loom_ir_graph *g, const loom_ir_plan *plan, bool outputs,
                              loom_ir_diag *d) {
    if (!g || !plan || !outputs)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "codegen: %s is NULL",
                                !g      ? "the graph"
                                : !plan ? "the plan"
                                        : "an output");
    if (plan->n_nodes != g->n_nodes)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                "codegen: the plan is for a graph of %d nodes, not %d",
                                (int)plan->n_nodes, (int)g->n_nodes);
    return LOOM_OK;
}

/* Checks every kernel of plan (cheap, no MLIR) into *out_recs (allocated from g's
 * allocator, *out_bytes long; freed here on failure). */
static loom_status check_kernels(const loom_ir_graph *g, const loom_ir_plan *plan,
                                 cg_kernel_rec **out_recs, size_t *out_bytes, loom_ir_diag *d) {
    const loom_allocator *a = &g->alloc;
    int32_t nk = plan->n_kernels;
    size_t recs_bytes = (size_t)(nk > 0 ? nk : 1) * sizeof(cg_kernel_rec);
    cg_kernel_rec *recs = loom_ir_alloc(a, recs_bytes);
    if (!recs)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "codegen: out of memory");
    memset(recs, 0, recs_bytes);
    check_job cj = {.g = g, .plan = plan, .recs = recs, .d = d};
    run_on_big_stack(check_main, &cj);
    if (cj.st != LOOM_OK) {
        loom_ir_free(a, recs, recs_bytes);
        return cj.st;
    }
    *out_recs = recs;
    *out_bytes = recs_bytes;
    return LOOM_OK;
}

loom_status loom_cg_check(const loom_ir_graph *g, const loom_ir_plan *plan, loom_ir_diag *d) {
    loom_status st = check_args(g, plan, true, d);
    cg_kernel_rec *recs = NULL;
    size_t recs_bytes = 0;
    if (st == LOOM_OK)
        st = check_kernels(g, plan, &recs, &recs_bytes, d);
    if (st == LOOM_OK)
        loom_ir_free(&g->alloc, recs, recs_bytes);
    return st;
}

/* Kernels of one structure share the first one's function (loom_ir_plan_share_kernels;
 * LOOM_CG_SHARE=0: none share, for measuring): the others' recs get its name, and order
 * (n_kernels entries) lists the kernels to compile, *n_order of them. */
static loom_status share_code(const loom_ir_graph *g, const loom_ir_plan *plan, cg_kernel_rec *recs,
                              int32_t *rep, int32_t *order, int32_t *n_order, loom_ir_diag *d) {
    const char *env = getenv("LOOM_CG_SHARE");
    if (env && strcmp(env, "0") == 0) {
        for (int32_t k = 0; k < plan->n_kernels; k++)
            rep[k] = k;
    } else if (loom_ir_plan_share_kernels(plan, g, rep, NULL) != LOOM_OK) {
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "codegen: out of memory");
    }
    /* A shared wrapper passes one pointer for an in-place pair: only kernels whose buffers
     * pair alike may share it. */
    for (int32_t k = 0; k < plan->n_kernels; k++) {
        if (rep[k] == k || plan->kernels[k].kind == LOOM_IR_KERNEL_COLLECTIVE)
            continue;
        int32_t a[2048], b[2048], n = plan_params(plan, k);
        if (n != plan_params(plan, rep[k]) || !param_classes(g, plan, k, a, 2048) ||
            !param_classes(g, plan, rep[k], b, 2048) || memcmp(a, b, (size_t)n * sizeof *a) != 0)
            rep[k] = k;
    }
    *n_order = 0;
    for (int32_t k = 0; k < plan->n_kernels; k++) {
        if (plan->kernels[k].kind == LOOM_IR_KERNEL_COLLECTIVE)
            continue;
        if (rep[k] == k)
            order[(*n_order)++] = k;
        else
            snprintf(recs[k].name, sizeof recs[k].name, "loom_k%d", (int)rep[k]);
    }
    return LOOM_OK;
}

loom_status loom_cg_compile(const loom_ir_graph *g, const loom_ir_plan *plan,
                            const loom_cg_options *opts, loom_cg_code **out_code,
                            loom_rt_kernel *out_kernels, loom_ir_diag *d) {
    loom_status st =
        check_args(g, plan, out_code && (out_kernels || !plan || plan->n_kernels == 0), d);
    if (st != LOOM_OK)
        return st;
    *out_code = NULL;
    loom_cg_options defaults = {0};
    if (!opts)
        opts = &defaults;
    loom_cg_init_once();
    const loom_allocator *a = &g->alloc;
    int32_t nk = plan->n_kernels;

    /* every kernel checked first (cheap, no MLIR): unsupported ops fail before any work */
    cg_kernel_rec *recs = NULL;
    size_t recs_bytes = 0;
    st = check_kernels(g, plan, &recs, &recs_bytes, d);
    if (st != LOOM_OK)
        return st;
    size_t order_bytes = (size_t)(nk > 0 ? nk : 1) * sizeof(int32_t);
    int32_t *rep = loom_ir_alloc(a, order_bytes), *order = loom_ir_alloc(a, order_bytes);
    int32_t n_order = 0;
    st = rep && order ? share_code(g, plan, recs, rep, order, &n_order, d)
                      : loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "codegen: out of memory");
    if (st != LOOM_OK) {
        loom_ir_free(a, rep, order_bytes);
        loom_ir_free(a, order, order_bytes);
        loom_ir_free(a, recs, recs_bytes);
        return st;
    }

    /* modules: several per thread for balance, unless that makes them small; small plans
     * stay on this thread (each thread pays for an MLIR context) */
    int32_t threads = opts->compile_threads > 0 ? opts->compile_threads : loom_rt_default_threads();
    if (threads < 1)
        threads = 1;
    int32_t workers = (n_order + 7) / 8;
    if (workers > threads)
        workers = threads;
    if (workers > MAX_WORKERS)
        workers = MAX_WORKERS;
    if (workers < 1)
        workers = 1;
    int64_t cost = 0;
    for (int32_t i = 0; i < n_order; i++)
        cost += compile_cost(g, plan, order[i]);
    int32_t n_jobs = n_order > 0 ? 1 : 0;
    if (workers > 1) {
        int64_t by_cost = cost / MODULE_MIN_COST;
        int32_t most =
            n_order < MODULES_PER_WORKER * workers ? n_order : MODULES_PER_WORKER * workers;
        by_cost += workers - 1 - (by_cost + workers - 1) % workers; /* as many per thread */
        n_jobs = by_cost < workers ? workers : by_cost > most ? most : (int32_t)by_cost;
    }
    compile_state cs = {.g = g,
                        .plan = plan,
                        .order = order,
                        .dumping = opts->dump_dir != NULL,
                        .inner = *a,
                        .n_jobs = n_jobs,
                        .trace = opts->trace};
    pthread_mutex_init(&cs.mu, NULL);
    cs.shared = (loom_allocator){.fn = locked_alloc, .ud = &cs};
    atomic_init(&cs.next, 0);
    atomic_init(&cs.failed, false);
    size_t jobs_bytes = (size_t)(n_jobs > 0 ? n_jobs : 1) * sizeof(job);
    cs.jobs = loom_ir_alloc(a, jobs_bytes);
    if (!cs.jobs) {
        pthread_mutex_destroy(&cs.mu);
        loom_ir_free(a, rep, order_bytes);
        loom_ir_free(a, order, order_bytes);
        loom_ir_free(a, recs, recs_bytes);
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "codegen: out of memory");
    }
    memset(cs.jobs, 0, jobs_bytes);
    split_modules(&cs, n_order, cost);
    for (int32_t j = 0; j < n_jobs; j++) {
        job *jb = &cs.jobs[j];
        loom_ir_diag_init(&jb->d);
        for (int f = 0; f < DUMP_COUNT_; f++)
            loom_ir_sbuf_init(&jb->dump[f], &cs.shared);
    }
    /* Every worker runs on a thread of its own with a large stack: evaluation recurses once
     * per fused node, and the caller's thread may be a pool thread with a small stack. If
     * no thread can be started, the caller compiles everything itself. */
    pthread_t tids[MAX_WORKERS];
    int32_t started = 0;
    pthread_attr_t attr;
    bool have_attr = pthread_attr_init(&attr) == 0;
    if (have_attr)
        pthread_attr_setstacksize(&attr, WORKER_STACK);
    for (int32_t t = 0; t < workers && n_jobs > 0; t++)
        if (pthread_create(&tids[started], have_attr ? &attr : NULL, worker_main, &cs) == 0)
            started++;
    if (have_attr)
        pthread_attr_destroy(&attr);
    if (started == 0 && n_jobs > 0)
        run_worker(&cs);
    for (int32_t t = 0; t < started; t++)
        pthread_join(tids[t], NULL);

    for (int32_t j = 0; j < n_jobs && st == LOOM_OK; j++)
        if (cs.jobs[j].st != LOOM_OK && cs.jobs[j].d.code != LOOM_OK) {
            *d = cs.jobs[j].d;
            st = cs.jobs[j].st;
        }
    if (st == LOOM_OK && atomic_load(&cs.failed))
        st = loom_ir_diag_set(d, LOOM_STATUS_INTERNAL, "codegen: a compile thread failed");
    if (cs.dumping) {
        loom_ir_diag dd;
        loom_ir_diag_init(&dd);
        loom_status ds = write_dumps(&cs, opts, st == LOOM_OK ? d : &dd);
        if (st == LOOM_OK)
            st = ds;
    }
    if (st == LOOM_OK) {
        const uint8_t *objs[MODULES_PER_WORKER * MAX_WORKERS];
        size_t lens[MODULES_PER_WORKER * MAX_WORKERS];
        for (int32_t j = 0; j < n_jobs; j++) {
            objs[j] = cs.jobs[j].obj;
            lens[j] = cs.jobs[j].obj_len;
        }
        int64_t t0 = loom_rt_now_ns();
        st = loom_cg_code_build(a, n_jobs, objs, lens, nk, recs, out_code, out_kernels,
                                LOOM_STATUS_INTERNAL, d);
        phase_add(T_JIT, t0);
    }
    const char *timing = getenv("LOOM_CG_TIMING");
    if (timing && timing[0] == '1') {
        fprintf(stderr,
                "codegen: %d kernels (%d compiled, the others sharing their code), %d "
                "modules, %d threads:",
                (int)nk, (int)n_order, (int)n_jobs, (int)workers);
        for (int p = 0; p < T_COUNT_; p++)
            fprintf(stderr, " %s %.1f ms%s", phase_name[p],
                    (double)atomic_exchange(&phase_ns[p], 0) / 1e6, p + 1 < T_COUNT_ ? "," : "\n");
    }
    for (int32_t j = 0; j < n_jobs; j++) {
        loom_ir_free(a, cs.jobs[j].obj, cs.jobs[j].obj_len ? cs.jobs[j].obj_len : 1);
        for (int f = 0; f < DUMP_COUNT_; f++)
            loom_ir_sbuf_deinit(&cs.jobs[j].dump[f]);
    }
    loom_ir_free(a, cs.jobs, jobs_bytes);
    loom_ir_free(a, rep, order_bytes);
    loom_ir_free(a, order, order_bytes);
    loom_ir_free(a, recs, recs_bytes);
    pthread_mutex_destroy(&cs.mu);
    return st;
}
