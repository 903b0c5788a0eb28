/* Loom IR: graphs of typed nodes in topological order, their op table, inference,
 * verification, text format, hashing and DOT export. The lowest layer: includes nothing
 * of Loom's but the public tables. */
#ifndef LOOM_IR_IR_H
#define LOOM_IR_IR_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/dist.h" /* loom_reduce_op */
#include "loom/loom.h"

/* ---- op table -------------------------------------------------------------------------- */

/* Op kinds and their traits: ir/kinds.def (what each column means is written there). */
typedef enum loom_ir_kind {
#define LOOM_KIND(e, ...) LOOM_IR_KIND_##e,
#include "kinds.def"
#undef LOOM_KIND
    LOOM_IR_KIND_COUNT_
} loom_ir_kind;

typedef struct loom_ir_kind_info {
    const char *name;
    bool loop, moves, roots, buffered, evaluates, pointwise, gen, leaf, ranks, window, bool_out,
        cond_first, cheap, operand_view, exact, unary, reduces, packs_operands, im2col;
} loom_ir_kind_info;

extern const loom_ir_kind_info loom_ir_kind_table[LOOM_IR_KIND_COUNT_];

typedef enum loom_ir_dtclass {
    LOOM_IR_DT_ANY,   /* every dtype */
    LOOM_IR_DT_NUM,   /* every dtype but bool */
    LOOM_IR_DT_FLOAT, /* f32, f16, bf16, f64 */
    LOOM_IR_DT_COUNT_
} loom_ir_dtclass;

typedef enum loom_ir_autocast {
    LOOM_IR_AC_NONE,
    LOOM_IR_AC_LOWER,   /* runs in the autocast dtype (matmul, conv, linear) */
    LOOM_IR_AC_FP32,    /* runs in f32 (softmax, norms, losses, reductions, exp/log/pow) */
    LOOM_IR_AC_PROMOTE, /* operands promoted to the widest float among them */
    LOOM_IR_AC_COUNT_
} loom_ir_autocast;

enum {
    LOOM_IR_OPF_COMMUTATIVE = 1u << 0,
    LOOM_IR_OPF_SIDE_EFFECT = 1u << 1,
};

typedef enum loom_ir_attrs_kind {
    LOOM_IR_ATTRS_NONE,
    LOOM_IR_ATTRS_INDEX,     /* attrs.index: which graph input */
    LOOM_IR_ATTRS_VALUE,     /* attrs.value: the fill value */
    LOOM_IR_ATTRS_PERM,      /* attrs.perm[rank] */
    LOOM_IR_ATTRS_AXES,      /* attrs.axes bitmask over the operand's axes, attrs.keepdim */
    LOOM_IR_ATTRS_SLICE,     /* attrs.start[rank] (start), attrs.step[rank] (stride >= 1) */
    LOOM_IR_ATTRS_PAD,       /* attrs.start[rank] (low), attrs.step[rank] (interior), attrs.value */
    LOOM_IR_ATTRS_AXIS,      /* attrs.index: one axis (concat, iota) */
    LOOM_IR_ATTRS_REDUCE,    /* attrs.index: loom_reduce_op, attrs.value: scale (all_reduce) */
    LOOM_IR_ATTRS_ROOT,      /* attrs.index: the root rank (broadcast_from) */
    LOOM_IR_ATTRS_WORLD,     /* attrs.index: the world size (all_gather) */
    LOOM_IR_ATTRS_CONV,      /* attrs.conv: stride, padding, dilation, groups */
    LOOM_IR_ATTRS_POOL,      /* attrs.conv: kernel, stride, padding, dilation (groups 0) */
    LOOM_IR_ATTRS_ATTENTION, /* attrs.index: causal (0, 1), attrs.value: the scale,
                              * attrs.dropout: the weights' dropout probability */
    LOOM_IR_ATTRS_COUNT_
} loom_ir_attrs_kind;

typedef enum loom_ir_op {
#define LOOM_OP(e, n, ar, k, dt, ac, fl, at) LOOM_IR_OP_##e,
#include "ops.def"
#undef LOOM_OP
    LOOM_IR_OP_COUNT_
} loom_ir_op;

typedef struct loom_ir_op_info {
    const char *name;
    int32_t arity; /* -1: variadic */
    loom_ir_kind kind;
    loom_ir_dtclass dtypes;
    loom_ir_autocast autocast;
    uint32_t flags;
    loom_ir_attrs_kind attrs;
} loom_ir_op_info;

extern const loom_ir_op_info loom_ir_op_table[LOOM_IR_OP_COUNT_];

/* The traits of op's kind (ir/kinds.def); op must be a valid op. */
static inline const loom_ir_kind_info *loom_ir_op_traits(loom_ir_op op) {
    return &loom_ir_kind_table[loom_ir_op_table[op].kind];
}

/* The op's name ("add"), "?" out of range. Lookup by name: LOOM_IR_OP_COUNT_ if none. */
const char *loom_ir_op_name(loom_ir_op op);
loom_ir_op loom_ir_op_from_name(const char *name, size_t len);
bool loom_ir_op_is_elementwise(loom_ir_op op);
/* The kind's and the autocast class's names as ops.def spells them, lower case ("unary",
 * "fp32"); "?" out of range. */
const char *loom_ir_kind_name(loom_ir_kind kind);
const char *loom_ir_autocast_name(loom_ir_autocast ac);
/* An all_reduce's combining op as the text format spells it ("sum", "max", "min"); "?" out
 * of range. */
const char *loom_ir_reduce_op_name(int64_t op);

/* ---- dtypes ---------------------------------------------------------------------------- */

bool loom_ir_dtype_valid(loom_dtype dt);
bool loom_ir_dtype_is_float(loom_dtype dt);
bool loom_ir_dtype_is_int(loom_dtype dt);
bool loom_ir_dtype_in_class(loom_dtype dt, loom_ir_dtclass c);
/* Lookup by name ("f32"): LOOM_DTYPE_COUNT_ if none. */
loom_dtype loom_ir_dtype_from_name(const char *name, size_t len);

/* 16-bit float conversions (round to nearest even; NaN stays NaN). The bf16 pair is inline:
 * loops over whole buffers call it (staging a bf16 all-reduce of 6.5M elements in f32 and
 * back took 19 ms through calls, 7 ms inline). */
static inline uint16_t loom_ir_f32_to_bf16(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet and a NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}
static inline float loom_ir_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    __builtin_memcpy(&f, &u, sizeof f);
    return f;
}
uint16_t loom_ir_f32_to_f16(float f);
float loom_ir_f16_to_f32(uint16_t h);

/* Element i of a buffer of dtype dt, as a double, and the reverse (with the dtype's
 * rounding / truncation toward zero / != 0 for bool). Integer paths: *_i64. */
double loom_ir_load_f64(const void *buf, loom_dtype dt, int64_t i);
void loom_ir_store_f64(void *buf, loom_dtype dt, int64_t i, double v);
int64_t loom_ir_load_i64(const void *buf, loom_dtype dt, int64_t i);
void loom_ir_store_i64(void *buf, loom_dtype dt, int64_t i, int64_t v);

/* ---- scalar semantics ------------------------------------------------------------------ */

/* One element of an elementwise op, the single definition that the reference interpreter
 * runs and constant folding evaluates (so folding is bit-identical to running). Floats:
 * operands loaded with loom_ir_load_f64, computed in double, the result rounded by
 * loom_ir_store_f64. Integers: loaded with loom_ir_load_i64, computed in int64 with
 * wrap-around (i32 wraps when stored; x / 0 is 0; INT_MIN / -1 and abs(INT_MIN) wrap).
 * Unary and predicate rules ignore b. Compares and predicates return 1 or 0 (C semantics:
 * every comparison with NaN is false except ne); bool operands compare on the int64 path.
 * maximum/minimum propagate NaN and order -0 below +0. Pure functions, thread-safe. */
typedef double (*loom_ir_scalar_f64_fn)(double a, double b);
typedef int64_t (*loom_ir_scalar_i64_fn)(int64_t a, int64_t b);
/* The op's rule on the float / the int64 path; NULL when it has none there: the op is not
 * elementwise, is float-only (exp on integers), or computes nothing (select moves bytes,
 * cast is a load in one dtype and a store in another). */
loom_ir_scalar_f64_fn loom_ir_scalar_rule_f64(loom_ir_op op);
loom_ir_scalar_i64_fn loom_ir_scalar_rule_i64(loom_ir_op op);

/* gelu_tanh's constants (ops.def), for every layer to compute the same u = C (x + K x^3). */
#define LOOM_IR_GELU_TANH_C 0.79788456080286535588 /* sqrt(2 / pi) */
#define LOOM_IR_GELU_TANH_K 0.044715

/* Element i (row-major linear index) of rand_uniform with this seed: the top 24 bits of
 * SplitMix64's output for the state seed + (i + 1) * 0x9E3779B97F4A7C15 (unsigned, wrapping),
 * times 2^-24. In [0, 1) and exact in f32, so every executor can match it bit for bit. */
double loom_ir_rand_uniform(int64_t seed, int64_t i);

/* SplitMix64's constants, for codegen to emit the same steps: z = state; z = (z ^ z >> S1)
 * * M1; z = (z ^ z >> S2) * M2; z ^= z >> S3; then the top LOOM_IR_RAND_BITS bits. */
#define LOOM_IR_RAND_GAMMA 0x9E3779B97F4A7C15ull
#define LOOM_IR_RAND_M1 0xBF58476D1CE4E5B9ull
#define LOOM_IR_RAND_M2 0x94D049BB133111EBull
#define LOOM_IR_RAND_S1 30
#define LOOM_IR_RAND_S2 27
#define LOOM_IR_RAND_S3 31
#define LOOM_IR_RAND_BITS 24

/* ---- memory ---------------------------------------------------------------------------- */

void *loom_ir_alloc(const loom_allocator *a, size_t size);
void *loom_ir_realloc(const loom_allocator *a, void *p, size_t old_size, size_t new_size);
void loom_ir_free(const loom_allocator *a, void *p, size_t size);
/* Grows *array (of elem_size items, capacity *cap) to hold at least `need` items.
 * false on out-of-memory (the array is unchanged). */
bool loom_ir_grow(const loom_allocator *a, void **array, int32_t *cap, int32_t need,
                  size_t elem_size);

/* Bump allocator in chunks from a loom_allocator; reset keeps the first chunk. */
typedef struct loom_ir_arena_chunk loom_ir_arena_chunk;
typedef struct loom_ir_arena {
    loom_allocator alloc;
    loom_ir_arena_chunk *head;
    size_t used; /* in head */
} loom_ir_arena;

void loom_ir_arena_init(loom_ir_arena *ar, const loom_allocator *a);
void loom_ir_arena_deinit(loom_ir_arena *ar);
void loom_ir_arena_reset(loom_ir_arena *ar);
/* 16-byte aligned; NULL on out-of-memory. */
void *loom_ir_arena_alloc(loom_ir_arena *ar, size_t size);
char *loom_ir_arena_strndup(loom_ir_arena *ar, const char *s, size_t len);

/* Growable string (for printing into memory). */
typedef struct loom_ir_sbuf {
    const loom_allocator *alloc;
    char *data; /* NUL-terminated when len > 0 */
    size_t len, cap;
    bool oom; /* an append failed: contents are truncated */
} loom_ir_sbuf;

void loom_ir_sbuf_init(loom_ir_sbuf *sb, const loom_allocator *a);
/* qsort's comparator for int32_t, ascending. */
int loom_ir_cmp_i32(const void *a, const void *b);
void loom_ir_sbuf_deinit(loom_ir_sbuf *sb);
void loom_ir_sbuf_append(loom_ir_sbuf *sb, const char *s, size_t len);
void loom_ir_sbuf_printf(loom_ir_sbuf *sb, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A loom_ir_write_fn that appends to the loom_ir_sbuf passed as ud. */
void loom_ir_sbuf_write(const char *chunk, size_t len, void *ud);
/* A loom_ir_write_fn into a caller's buffer of size >= 1 bytes (ud: a loom_ir_fixed_buf),
 * always NUL-terminated, output past size - 1 bytes cut; the first `skip` bytes are dropped. */
typedef struct loom_ir_fixed_buf {
    char *buf;
    size_t size, len, skip;
} loom_ir_fixed_buf;
void loom_ir_fixed_buf_write(const char *chunk, size_t len, void *ud);

/* A chunked writer over a loom_ir_write_fn: output is staged in a fixed buffer and handed
 * to the callback in large pieces, allocating nothing (printers use it). */
typedef struct loom_ir_writer {
    void (*write)(const char *chunk, size_t len, void *ud);
    void *ud;
    size_t len;
    char buf[4096];
} loom_ir_writer;

void loom_ir_writer_put(loom_ir_writer *w, const char *s, size_t len);
void loom_ir_writer_puts(loom_ir_writer *w, const char *s);
/* For short formatted pieces (a few numbers): output past 255 bytes is cut. */
void loom_ir_writer_printf(loom_ir_writer *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void loom_ir_writer_flush(loom_ir_writer *w);

/* ---- diagnostics ----------------------------------------------------------------------- */

typedef struct loom_ir_diag {
    loom_status code;   /* LOOM_OK while empty */
    int32_t line, col;  /* 1-based source position for parse errors, 0 otherwise */
    int32_t node;       /* the offending node for verify errors, -1 otherwise */
    char msg[512];
} loom_ir_diag;

void loom_ir_diag_init(loom_ir_diag *d);
/* Records an error unless one is already recorded (the first error wins). Returns code. */
loom_status loom_ir_diag_set(loom_ir_diag *d, loom_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
loom_status loom_ir_diag_vset(loom_ir_diag *d, loom_status code, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* "f32[64,784]" (scalars: "f32[]") into buf; returns buf. */
char *loom_ir_format_type(char *buf, size_t size, loom_dtype dt, int32_t rank,
                          const int64_t *shape);
#define LOOM_IR_TYPE_STR_MAX 160

/* ---- graphs ---------------------------------------------------------------------------- */

/* Where a node came from: the user's source line and the scope (module) it was recorded in,
 * "layer1.0.conv1" (loom_scope_push), with backward set on the nodes autograd made for the
 * gradients of that scope's nodes. Carried through every pass as the source line is; never
 * hashed or compared (a scope renames nothing that compiles). Printed as
 * loc("train.c":88, scope = "layer1.0.conv1", backward); either half may be absent. */
typedef struct loom_ir_loc {
    const char *file; /* NULL: unknown; otherwise owned by the graph's arena */
    int32_t line;
    const char *scope; /* NULL: none; otherwise owned by the graph's arena */
    bool backward;
} loom_ir_loc;

/* A convolution's window: stride >= 1, padding >= 0 (both sides), dilation >= 1 over
 * {h, w}; groups >= 1 divides the input and output channels. A pooling window has its
 * kernel {KH, KW} >= 1 here and groups 0; a convolution's kernel is 0 (its weight's shape
 * gives it). */
typedef struct loom_ir_conv {
    int64_t stride[2], padding[2], dilation[2];
    int64_t groups;
    int64_t kernel[2];
} loom_ir_conv;

/* The most taps (KH * KW) a max pool's window may have: its kernel unrolls them. */
enum { LOOM_IR_POOL_TAPS_MAX = 256 };

typedef struct loom_ir_attrs {
    int64_t index; /* INDEX, AXIS, REDUCE (the op), ROOT, WORLD, ATTENTION */
    double value;  /* VALUE, PAD (the fill value), REDUCE and ATTENTION (the scale) */
    int32_t perm[LOOM_MAX_RANK];  /* PERM */
    uint32_t axes;                /* AXES: bit i set = axis i of the operand is reduced */
    bool keepdim;                 /* AXES */
    int64_t start[LOOM_MAX_RANK]; /* SLICE: start; PAD: low */
    int64_t step[LOOM_MAX_RANK];  /* SLICE: stride (>= 1); PAD: interior (>= 0) */
    loom_ir_conv conv;            /* CONV */
    double dropout; /* ATTENTION: the weights' dropout probability, in [0, 1) (ops.def) */
    /* Every op: the autocast scope it was recorded in (bf16 or f16; f32 = none). Printed as
     * `autocast = bf16`, hashed and compared like the op's own attributes; the autocast pass
     * turns it into casts and clears it (passes.h). */
    loom_dtype autocast;
} loom_ir_attrs;

typedef struct loom_ir_node {
    loom_ir_op op;
    loom_dtype dtype;
    int32_t rank;
    int32_t n_inputs;
    int64_t shape[LOOM_MAX_RANK];
    int32_t *inputs; /* ids of earlier nodes; arena-owned */
    loom_ir_attrs attrs;
    loom_ir_loc loc;
} loom_ir_node;

typedef struct loom_ir_output {
    int32_t node;  /* node id */
    int32_t alias; /* graph input index whose buffer this output is written into, or -1 */
} loom_ir_output;

/* A graph: nodes in topological order (operands precede users), the outputs, and which
 * graph input each output is written back into (buffer donation, -1 for none).
 * Not thread-safe; owns everything it points to. */
typedef struct loom_ir_graph {
    loom_allocator alloc;
    loom_ir_node *nodes;
    int32_t n_nodes, cap_nodes;
    loom_ir_output *outputs;
    int32_t n_outputs, cap_outputs;
    int32_t n_graph_inputs; /* INPUT nodes; their indices are 0..n-1, each once */
    loom_ir_arena arena;
    const char *last_file; /* interning cache: last file string seen and its arena copy */
    const char *last_file_copy;
    const char *last_scope; /* the same for scopes */
    const char *last_scope_copy;
} loom_ir_graph;

void loom_ir_graph_init(loom_ir_graph *g, const loom_allocator *a);
void loom_ir_graph_deinit(loom_ir_graph *g);
/* Empties the graph, keeping its capacity. */
void loom_ir_graph_reset(loom_ir_graph *g);

/* What a new node needs besides its operands: the result type for ops whose type is not
 * derived from operands (input/constant: dtype and shape; cast: dtype; broadcast/reshape:
 * shape) and the attributes. */
typedef struct loom_ir_node_desc {
    loom_ir_op op;
    int32_t n_inputs;
    const int32_t *inputs;
    loom_dtype dtype;
    int32_t rank;
    const int64_t *shape;
    loom_ir_attrs attrs;
    loom_ir_loc loc;
} loom_ir_node_desc;

/* Infers the result dtype and shape of `desc` over the nodes of g, checking operand
 * count, dtypes and shapes. Errors (INVALID_ARGUMENT) go to d with a message such as
 * "inner dimensions differ: f32[64,784] x f32[512,784]" (no location prefix). */
loom_status loom_ir_infer(const loom_ir_graph *g, const loom_ir_node_desc *desc,
                          loom_dtype *out_dtype, int32_t *out_rank, int64_t *out_shape,
                          loom_ir_diag *d);

/* Infers, then appends a node. *out_id gets its id. The loc's file is interned into the
 * graph's arena. Errors: INVALID_ARGUMENT (inference), OUT_OF_MEMORY. */
loom_status loom_ir_graph_add(loom_ir_graph *g, const loom_ir_node_desc *desc,
                              int32_t *out_id, loom_ir_diag *d);

/* Appends an output (alias: graph input index or -1). */
loom_status loom_ir_graph_add_output(loom_ir_graph *g, int32_t node, int32_t alias);

/* Replaces dst by the part of src that the given roots depend on, in src's order; the
 * roots become dst's outputs, each aliasing aliases[r] (a src graph input index, or -1;
 * aliases may be NULL). With keep_inputs every INPUT node is kept with its index (the
 * graph's signature stays); without, only live INPUT nodes and the aliased ones are kept
 * and renumbered densely in node order (aliases are translated). If map is not NULL it gets
 * src->n_nodes entries: the dst id of each src node, or -1 when not copied. */
loom_status loom_ir_graph_extract(loom_ir_graph *dst, const loom_ir_graph *src,
                                  int32_t n_roots, const int32_t *roots,
                                  const int32_t *aliases, bool keep_inputs, int32_t *map);
/* dst = a copy of src. */
loom_status loom_ir_graph_copy(loom_ir_graph *dst, const loom_ir_graph *src);

/* Checks every invariant: topological order, operand counts, each node's type against
 * inference, attributes, inputs numbered 0..n-1 once each, outputs and aliases in range
 * (an alias names an input of the output's dtype and shape, at most once).
 * Errors: VERIFY_FAILED with d->node set. */
loom_status loom_ir_graph_verify(const loom_ir_graph *g, loom_ir_diag *d);

/* Structural hash: ops, attributes, dtypes, shapes, edges, outputs and aliases; not
 * locations. Equal graphs hash equal. */
uint64_t loom_ir_graph_hash(const loom_ir_graph *g);
/* out[i] (g->n_nodes of them): a hash of nodes 0..i as loom_ir_graph_hash sees them, so two
 * graphs' first structural difference is the first i where theirs differ (what ranks compare
 * to name where their steps part without sending graphs). */
void loom_ir_graph_prefix_hashes(const loom_ir_graph *g, uint64_t *out);
/* Structural equality (the same things the hash covers). */
bool loom_ir_graph_equal(const loom_ir_graph *a, const loom_ir_graph *b);
/* Whether two nodes of the same op (and rank) carry equal attributes, the ones their op
 * has. By bits: constants 0.0 and -0.0 differ, and a NaN equals itself. */
bool loom_ir_attrs_equal(const loom_ir_node *a, const loom_ir_node *b);
/* A hash of one node alone: op, type and the attribute fields, not its operands or
 * location. Equal for nodes that are equal by op, type and loom_ir_attrs_equal (unused
 * attribute fields are zero as the builders and the parser make nodes), so it narrows a
 * search that loom_ir_attrs_equal then decides. */
uint64_t loom_ir_node_local_key(const loom_ir_node *n);
/* Whether two convolution windows are the same (field by field: no padding bytes compared). */
bool loom_ir_conv_equal(const loom_ir_conv *a, const loom_ir_conv *b);

/* Chunked output callback. */
typedef void (*loom_ir_write_fn)(const char *chunk, size_t len, void *ud);

/* Text format (MLIR-like), one node a line:
 *   // comments run to the end of the line
 *   loom.graph {
 *     %0 = input {index = 0} : f32[2,3] loc("x.c":4)
 *     %1 = constant {value = 0.5} : f32[]
 *     %2 = broadcast %1 : f32[2,3]
 *     %3 = add %0, %2 : f32[2,3] loc("x.c":5)
 *     %4 = transpose %3 {perm = [1, 0]} : f32[3,2]
 *     %5 = reduce_sum %3 {axes = [1], keepdim = false} : f32[2] loc("x.c":7)
 *     %6 = slice %0 {start = [0, 1], stride = [1, 2]} : f32[2,1]
 *     %7 = pad %0 {low = [1, 0], interior = [0, 1], value = 0} : f32[4,5]
 *     %8 = concat %0, %3 {axis = 0} : f32[4,3]
 *     %9 = iota {axis = 1} : i64[2,3]
 *     %10 = all_reduce %3 {reduce = sum, scale = 0.5} : f32[2,3]
 *     %11 = broadcast_from %0 {root = 0} : f32[2,3]
 *     %12 = all_gather %0 {world = 2} : f32[4,3]
 *     %13 = conv2d %x, %w {stride = [2, 2], padding = [1, 1], dilation = [1, 1], groups = 1}
 *           : f32[8,16,14,14]   (one line in the text)
 *     return %3 {alias = 0}, %5
 *   }
 * Every node states its result type; for cast, broadcast, reshape, input, constant, iota,
 * rand_uniform and the convolution gradients that type is the op's target (for slice it gives the
 * sizes, for pad the high side). Constants print with %.17g (inf, -inf, nan spelled so). A location
 * is loc("file":line) (quotes and backslashes escaped) or absent when unknown. The parser accepts
 * any %name defined before use and numbers nodes densely in order. parse(print(g)) gives a graph
 * equal to g with the same locations. */
loom_status loom_ir_graph_print(const loom_ir_graph *g, loom_ir_write_fn write, void *ud);
/* Parses text (len bytes, need not be NUL-terminated) into g (which is reset first) and
 * verifies it. Errors: PARSE_ERROR with d->line/col and a message, VERIFY_FAILED,
 * OUT_OF_MEMORY. On error g is left empty. */
loom_status loom_ir_graph_parse(loom_ir_graph *g, const char *text, size_t len,
                                loom_ir_diag *d);
/* Graphviz DOT: one box per node (op, type, location), edges operand -> user. */
loom_status loom_ir_graph_dot(const loom_ir_graph *g, loom_ir_write_fn write, void *ud);

/* Estimated arithmetic operations of node n of g: 2*M*N*K per matmul batch, one per element
 * for elementwise ops, one per input element for reductions, none for sources and data
 * movement. A double, as large shapes overflow int64. */
double loom_ir_node_flops(const loom_ir_graph *g, const loom_ir_node *n);

/* Bytes of node n's value (row-major, packed). */
size_t loom_ir_node_bytes(const loom_ir_node *n);
/* The value a chain of RESHAPEs starting at node n views: the first node that is not a
 * RESHAPE (n itself when it is not one). */
int32_t loom_ir_view_base(const loom_ir_graph *g, int32_t n);

/* Output extent of a convolution or pooling window sweep over `in` (padded by pad on both
 * sides): (in + 2 pad - dil (k - 1) - 1) / stride + 1, or 0 when the window does not fit or
 * an argument is out of range (k, stride, dil < 1, pad < 0); never overflows. */
int64_t loom_ir_conv_out_extent(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil);

/* Number of elements of a shape (1 for rank 0). */
int64_t loom_ir_numel(int32_t rank, const int64_t *shape);

/* The element strides of a row-major shape [rank] broadcast (numpy's rule, right-aligned)
 * to a result of rank r >= rank: stride[r - rank + i] for its axis i, 0 where it has extent
 * 1, and 0 for the r - rank leading axes it lacks. Returns its number of elements. */
int64_t loom_ir_broadcast_strides(int32_t rank, const int64_t *shape, int32_t r, int64_t *stride);

/* Whether n is a TRANSPOSE swapping exactly its last two axes (a linear layer's W^T). */
static inline bool loom_ir_swaps_last2(const loom_ir_node *n) {
    if (n->op != LOOM_IR_OP_TRANSPOSE || n->rank < 2)
        return false;
    for (int32_t i = 0; i < n->rank - 2; i++)
        if (n->attrs.perm[i] != i)
            return false;
    return n->attrs.perm[n->rank - 2] == n->rank - 1 && n->attrs.perm[n->rank - 1] == n->rank - 2;
}

/* The most operands with fixed roles an op has (an attention gradient's 6, its seed and its
 * mask): every layer that names operands by role holds this many. */
enum { LOOM_IR_ROLE_OPERANDS_MAX = 8 };

/* The operands an attention op (ops.def) has before its dropout seed: q, k, v; q, k; q, k, v,
 * do, lse, delta; or q, k, do, lse. */
static inline int32_t loom_ir_attention_operands(loom_ir_op op) {
    return op == LOOM_IR_OP_ATTENTION_LSE      ? 2
           : op == LOOM_IR_OP_ATTENTION        ? 3
           : op == LOOM_IR_OP_ATTENTION_GRAD_V ? 4
                                               : 6;
}

/* The operand index of attention node n's mask (ops.def: last, after any seed), or -1. */
static inline int32_t loom_ir_attention_mask(const loom_ir_node *n) {
    int32_t m = loom_ir_attention_operands(n->op) + (n->attrs.dropout > 0);
    return n->n_inputs > m ? m : -1;
}

/* Whether nodes a and b have the same rank and extents (dtypes aside). */
static inline bool loom_ir_same_shape(const loom_ir_node *a, const loom_ir_node *b) {
    if (a->rank != b->rank)
        return false;
    for (int32_t i = 0; i < a->rank; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

/* The one file writer (ir/file.c). A regular file (or none) at path is replaced atomically:
 * the data goes to a temp file "<path>.tmp.<pid>.<random>" in the same folder, created with
 * O_EXCL | O_NOFOLLOW (a file or link planted at that name is never opened or followed),
 * synced, renamed over path, and the folder synced; temp files that processes which no
 * longer run left beside path are removed. A symbolic link is followed to the regular file
 * it names (replaced in its own folder), except one another user owns in a sticky
 * world-writable folder. A FIFO or a character device (a terminal, /dev/null) is written in
 * place, never replaced (a FIFO nothing reads is an error, not a wait); a folder, socket or
 * block device is refused. mode > 0: the new file's permissions (exactly, whatever the
 * umask); 0: those of the file it replaces, else 0666 less the umask. Errors:
 * INVALID_ARGUMENT, IO_ERROR (message in d, naming path). */
loom_status loom_ir_write_file(const char *path, const void *data, size_t len, int mode,
                               loom_ir_diag *d);
/* loom_ir_write_file with mode 0. */
loom_status loom_ir_write_file_atomic(const char *path, const void *data, size_t len,
                                      loom_ir_diag *d);
/* Removes temp files of loom_ir_write_file that processes no longer running left beside
 * path, if they are the caller's regular files. */
void loom_ir_remove_stale_temps(const char *path);
/* The one way files are opened for reading: *out_fd (O_CLOEXEC, blocking) and the file's
 * size, for a regular file only; a FIFO, device or folder is refused without blocking (it is
 * opened O_NONBLOCK, then checked). The caller closes *out_fd. Errors: IO_ERROR (message in
 * d, naming path and what it is). */
loom_status loom_ir_open_regular(const char *path, int *out_fd, uint64_t *out_size,
                                 loom_ir_diag *d);
/* Reads exactly n bytes at offset off. Errors: IO_ERROR, CORRUPT_DATA (the file ends
 * first), messages naming path. */
loom_status loom_ir_pread_full(int fd, void *buf, size_t n, uint64_t off, const char *path,
                               loom_ir_diag *d);
/* The largest file loom_ir_read_file reads (text: IR files, dumps). */
#define LOOM_IR_READ_FILE_MAX ((uint64_t)1 << 30)
/* Reads a whole file ("-" is stdin) into *out_data (allocated with a; *out_len bytes plus a
 * NUL): a regular file (loom_ir_open_regular) of at most LOOM_IR_READ_FILE_MAX bytes.
 * Errors: IO_ERROR, OUT_OF_MEMORY. */
loom_status loom_ir_read_file(const char *path, const loom_allocator *a, char **out_data,
                              size_t *out_len, loom_ir_diag *d);

/* ---- structural diff ------------------------------------------------------------------- */

/* How two graphs differ, node by node. Nodes are matched by structure, not by id (ids shift
 * when a node is inserted): identical subgraphs first (same op, type, attributes and matched
 * operands, bottom-up from the sources), then nodes of the same op whose operands are
 * matched (so a changed input shape still pairs every node downstream with its old self),
 * then top-down from the outputs (pairing operands of matched nodes that have the same op:
 * this finds a constant whose value changed under an unchanged user), and last the
 * constants still unpaired, in order within each type. Graph inputs are identified by their
 * index (an input inserted before others shows as changes to the later ones). Locations
 * are not compared. O(n log n) in the node count; deterministic.
 *
 * Each difference is one item; its text is one line naming the node with the user's
 * file:line (the basename, as error messages show it), for example
 *   %7 matmul at train.c:88 has f32[63,784] (was f32[64,784])
 *   %3 constant at train.c:61 is a constant that changes between graphs: value = 0.0099 (was
 *      value = 0.01)
 * (values in the fewest digits that read back exactly).
 * Node ids are the second graph's, except in REMOVED items (the node exists only in the
 * first). Items come in a fixed order: the second graph's nodes in order (new nodes and
 * changes of their own), then removed nodes in the first graph's order, then outputs, then
 * type changes that follow from changes listed before them (`derived`). */
typedef enum loom_ir_diff_kind {
    LOOM_IR_DIFF_TYPE,     /* a matched node has another dtype or shape */
    LOOM_IR_DIFF_ATTRS,    /* a matched node has other attributes (not a constant's value) */
    LOOM_IR_DIFF_CONSTANT, /* a constant's value differs: a constant that changes between
                            * graphs (which defeats a cache keyed on the graph) */
    LOOM_IR_DIFF_OPERANDS, /* a matched node takes other operands, none of them new or gone */
    LOOM_IR_DIFF_ADDED,    /* a node only in the second graph */
    LOOM_IR_DIFF_REMOVED,  /* a node only in the first graph */
    LOOM_IR_DIFF_OUTPUT,   /* output `output` is another node, has another alias, or exists
                            * in one graph only */
    LOOM_IR_DIFF_COUNT_
} loom_ir_diff_kind;

typedef struct loom_ir_diff_item {
    loom_ir_diff_kind kind;
    int32_t a, b;   /* the node in the first / second graph; -1 where there is none */
    int32_t output; /* OUTPUT: the output's index; -1 otherwise */
    bool derived;   /* TYPE: explained by a change of its operands or of its own attributes */
} loom_ir_diff_item;

/* A computed diff, in caller storage. The graphs are borrowed: they must outlive any use of
 * the diff and stay unchanged. Not thread-safe; separate diffs are independent. */
typedef struct loom_ir_diff {
    loom_allocator alloc;
    const loom_ir_graph *a, *b;
    int32_t *a_to_b, *b_to_a; /* the matching: the other graph's node, or -1 */
    int32_t n_a, n_b;         /* node counts the matching arrays were made for */
    loom_ir_diff_item *items;
    int32_t n_items, cap_items;
} loom_ir_diff;

void loom_ir_diff_init(loom_ir_diff *df, const loom_allocator *a);
/* Frees what the diff holds; accepts a diff that was only initialized. */
void loom_ir_diff_deinit(loom_ir_diff *df);

/* Matches the nodes of a (the earlier graph) and b and lists their differences in
 * df->items (0 items: structurally equal as loom_ir_graph_equal would say, up to node
 * order). Both graphs should verify. Errors: INVALID_ARGUMENT (NULL, or an operand or output
 * out of range), OUT_OF_MEMORY; on error df holds no items. */
loom_status loom_ir_diff_compute(loom_ir_diff *df, const loom_ir_graph *a, const loom_ir_graph *b,
                                 loom_ir_diag *d);
/* Item i's text (one line, no newline) into buf, cut to size - 1 bytes; returns buf. "" when
 * i is out of range. */
char *loom_ir_diff_format_item(const loom_ir_diff *df, int32_t i, char *buf, size_t size);
/* Writes the items one a line; with max_items >= 0, at most that many, then
 * "... and N more differences" when some were left out. Does nothing when df or write is
 * NULL. */
void loom_ir_diff_print(const loom_ir_diff *df, int32_t max_items, loom_ir_write_fn write,
                        void *ud);

/* Computes the diff of a and b (memory from a's allocator), writes it as loom_ir_diff_print
 * does, and sets *out_n_differences (may be NULL) to the number of items. A recompilation
 * explainer writes the first cause with max_items = 1. Errors as loom_ir_diff_compute. */
loom_status loom_ir_graph_diff(const loom_ir_graph *a, const loom_ir_graph *b, int32_t max_items,
                               loom_ir_write_fn write, void *ud, int32_t *out_n_differences,
                               loom_ir_diag *d);

/* A fixed-size sketch of a graph for picking the nearest of many earlier graphs cheaply: a
 * histogram of its nodes by op, dtype, shape and attributes (not edges, not locations).
 * A cache can keep one per entry; making one allocates nothing. */
#define LOOM_IR_SKETCH_BUCKETS 1024
typedef struct loom_ir_sketch {
    uint32_t count[LOOM_IR_SKETCH_BUCKETS];
    int32_t n_outputs;
} loom_ir_sketch;

void loom_ir_graph_sketch(const loom_ir_graph *g, loom_ir_sketch *out);
/* The number of nodes of either graph that have no equal counterpart in the other (a node
 * whose type changed counts twice: as it was and as it is) plus the difference in output
 * counts. A lower bound (buckets collide): 0 for equal graphs, small for near ones. */
int64_t loom_ir_sketch_distance(const loom_ir_sketch *a, const loom_ir_sketch *b);
/* The same for two graphs, sketching both. */
int64_t loom_ir_graph_distance(const loom_ir_graph *a, const loom_ir_graph *b);

/* Text pieces that the printer, the diff and messages share. loom_ir_write_attrs writes a
 * node's attributes as the text format spells them between its braces ("perm = [1, 0]",
 * "value = 0.5, autocast = bf16"); false (nothing written) when it has none. Values print
 * with %.17g, or with `shortest` (for messages) in the fewest digits that read back as the
 * same double.
 * loom_ir_format_loc writes "train.c:88" (the file's basename) into buf, with the scope
 * "layer1.0.conv1 (train.c:88)" ("layer1.0.conv1.grad (train.c:88)" on backward nodes), ""
 * when the location is unknown; returns buf. */
bool loom_ir_write_attrs(loom_ir_writer *w, const loom_ir_node *n, bool shortest);
char *loom_ir_format_loc(char *buf, size_t size, loom_ir_loc loc);
/* Node n, numbered id, as the printer writes its line without indent and newline
 * ("%7 = matmul %3, %5 : f32[64,10] loc("train.c":88)"), cut to size - 1 bytes; returns buf. */
char *loom_ir_format_node(char *buf, size_t size, const loom_ir_node *n, int32_t id);
#define LOOM_IR_LOC_STR_MAX 256

#endif /* LOOM_IR_IR_H */
