/* Tensors: generation-checked handles over slots, host transfers, reference counting. */
#include <string.h>

#include "frontend.h"

#define SLOT_MASK ((UINT64_C(1) << LOOM_FE_SLOT_BITS) - 1)
#define GEN_MASK ((UINT64_C(1) << LOOM_FE_GEN_BITS) - 1)

loom_tensor *loom_fe_handle(const loom_context *ctx, int32_t slot) {
    uint64_t v = (uint64_t)ctx->id << (64 - LOOM_FE_CTX_BITS) |
                 ((uint64_t)ctx->tensors[slot].gen & GEN_MASK) << LOOM_FE_SLOT_BITS |
                 (uint64_t)(slot + 1); /* + 1: never NULL */
    return (loom_tensor *)(uintptr_t)v;
}

/* Decodes a handle against ctx without recording anything: the slot, or -1 with *why. */
static int32_t decode(const loom_context *ctx, const loom_tensor *h, loom_status *why) {
    uint64_t v = (uint64_t)(uintptr_t)h;
    int64_t slot = (int64_t)(v & SLOT_MASK) - 1;
    uint32_t gen = (uint32_t)((v >> LOOM_FE_SLOT_BITS) & GEN_MASK);
    if ((int32_t)(v >> (64 - LOOM_FE_CTX_BITS)) != ctx->id || slot < 0 || slot >= ctx->n_tensors) {
        *why = LOOM_STATUS_INVALID_ARGUMENT;
        return -1;
    }
    const loom_fe_tensor *t = &ctx->tensors[slot];
    if (!t->alive || (t->gen & GEN_MASK) != gen) {
        *why = LOOM_STATUS_STALE_HANDLE;
        return -1;
    }
    return (int32_t)slot;
}

static void record_bad_handle(loom_context *ctx, loom_status why, const char *file, int line,
                              const char *op) {
    if (why == LOOM_STATUS_STALE_HANDLE)
        loom_fe_error(ctx, why, file, line, op,
                      "tensor handle is stale: the tensor died at an earlier mark_step or was "
                      "released (op results live one step unless loom_tensor_retain'ed)");
    else
        loom_fe_error(ctx, why, file, line, op,
                      "not a tensor handle of this context (another context's, or garbage)");
}

loom_fe_tensor *loom_fe_tensor_get(loom_context *ctx, const loom_tensor *h, const char *file,
                                   int line, const char *op) {
    loom_status why;
    int32_t slot = decode(ctx, h, &why);
    if (slot < 0) {
        record_bad_handle(ctx, why, file, line, op);
        return NULL;
    }
    return &ctx->tensors[slot];
}

int32_t loom_fe_tensor_new(loom_context *ctx) {
    int32_t slot = ctx->free_head;
    if (slot >= 0) {
        ctx->free_head = ctx->tensors[slot].next_free;
    } else {
        if (ctx->n_tensors >= (int32_t)SLOT_MASK - 1)
            return -1;
        if (!loom_ir_grow(&ctx->alloc, (void **)&ctx->tensors, &ctx->cap_tensors,
                          ctx->n_tensors + 1, sizeof *ctx->tensors))
            return -1;
        slot = ctx->n_tensors++;
        ctx->tensors[slot].gen = 1;
    }
    loom_fe_tensor *t = &ctx->tensors[slot];
    uint32_t gen = t->gen;
    memset(t, 0, sizeof *t);
    t->gen = gen;
    t->alive = true;
    t->node = -1;
    t->node_step = -1;
    t->input_node = -1;
    t->input_step = -1;
    t->assigned_step = -1;
    ctx->n_live_tensors++;
    return slot;
}

void loom_fe_tensor_free(loom_context *ctx, int32_t slot) {
    loom_fe_tensor *t = &ctx->tensors[slot];
    if (t->assigned_step == ctx->step) {
        /* A long-lived tensor released with an assignment pending: nothing is left to write
         * into, and the slot's next tenant must not inherit the entry. */
        for (int32_t k = 0; k < ctx->n_assigned; k++)
            if (ctx->assigned[k] == slot)
                ctx->assigned[k] = ctx->assigned[--ctx->n_assigned];
    }
    loom_rt_buffer_release(t->buf);
    t->buf = NULL;
    t->alive = false;
    t->gen = (t->gen + 1) & (uint32_t)GEN_MASK;
    if (t->gen == 0)
        t->gen = 1;
    t->next_free = ctx->free_head;
    ctx->free_head = slot;
    ctx->n_live_tensors--;
}

int32_t loom_fe_tensor_node(loom_context *ctx, int32_t slot, const char *file, int line,
                            const char *op) {
    loom_fe_tensor *t = &ctx->tensors[slot];
    if (t->node_step == ctx->step && t->node >= 0)
        return t->node;
    if (!t->buf) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "operand has no value: the step that should have computed it failed");
        return -1;
    }
    if (t->input_step == ctx->step)
        return t->input_node;
    /* First use of a computed tensor in this step: read it through a new graph input. */
    int32_t k = ctx->n_trace_inputs;
    if (!loom_fe_graph_room(ctx, file, line, op))
        return -1;
    if (!loom_ir_grow(&ctx->alloc, (void **)&ctx->trace_inputs, &ctx->cap_trace_inputs, k + 1,
                      sizeof *ctx->trace_inputs) ||
        !loom_ir_grow(&ctx->alloc, (void **)&ctx->trace_input_nodes,
                      &ctx->cap_trace_input_nodes, k + 1, sizeof *ctx->trace_input_nodes)) {
        loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, file, line, op, "out of memory");
        return -1;
    }
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_INPUT, .dtype = t->dtype, .rank = t->rank,
                              .shape = t->shape, .attrs = {.index = k}, .loc = t->loc};
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    int32_t id;
    if (loom_ir_graph_add(&ctx->trace, &desc, &id, &d) != LOOM_OK) {
        loom_fe_error(ctx, d.code, file, line, op, "%s", d.msg);
        return -1;
    }
    loom_rt_buffer_retain(t->buf); /* the step reads it even if the tensor is released */
    ctx->trace_inputs[k] = t->buf;
    ctx->trace_input_nodes[k] = id;
    ctx->n_trace_inputs = k + 1;
    t->input_node = id;
    t->input_step = ctx->step;
    return id;
}

loom_tensor *loom_fe_result(loom_context *ctx, int32_t node, const char *file, int line,
                            const char *op) {
    if (!loom_ir_grow(&ctx->alloc, (void **)&ctx->step_tensors, &ctx->cap_step_tensors,
                      ctx->n_step_tensors + 1, sizeof *ctx->step_tensors)) {
        loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, file, line, op, "out of memory");
        return NULL;
    }
    int32_t slot = loom_fe_tensor_new(ctx);
    if (slot < 0) {
        loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, file, line, op, "out of memory");
        return NULL;
    }
    loom_fe_tensor *t = &ctx->tensors[slot];
    const loom_ir_node *n = &ctx->trace.nodes[node];
    t->step_owned = true;
    t->dtype = n->dtype;
    t->rank = n->rank;
    memcpy(t->shape, n->shape, sizeof t->shape);
    t->node = node;
    t->node_step = ctx->step;
    t->loc = (loom_ir_loc){file, line, ctx->scope, false};
    ctx->step_tensors[ctx->n_step_tensors++] = slot;
    loom_rt_metrics_add(&ctx->metrics, LOOM_RT_METRIC_TRACED_OPS, 1);
    return loom_fe_handle(ctx, slot);
}

LOOM_API loom_tensor *loom_tensor_from_host_at(loom_context *ctx, loom_dtype dtype,
                                               int32_t rank, const int64_t *shape,
                                               const void *data, const char *file, int line) {
    LOOM_FE_USE(ctx, "tensor_from_host", NULL);
    static const char op[] = "tensor_from_host";
    if (!ctx)
        return NULL;
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_INPUT, .dtype = dtype, .rank = rank, .shape = shape};
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_dtype odt;
    int32_t orank;
    int64_t oshape[LOOM_MAX_RANK];
    if (loom_ir_infer(&ctx->trace, &desc, &odt, &orank, oshape, &d) != LOOM_OK) {
        loom_fe_error(ctx, d.code, file, line, op, "%s", d.msg);
        return NULL;
    }
    size_t bytes = (size_t)loom_ir_numel(rank, shape) * loom_dtype_size(dtype);
    if (!data && bytes > 0) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op, "data is NULL");
        return NULL;
    }
    int32_t slot = loom_fe_tensor_new(ctx);
    loom_rt_buffer *buf = NULL;
    if (slot < 0 || loom_rt_buffer_alloc(ctx->device, bytes, &buf) != LOOM_OK) {
        if (slot >= 0)
            loom_fe_tensor_free(ctx, slot);
        char cap[160];
        loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, file, line, op,
                      "out of memory for %zu bytes of device memory%s", bytes,
                      loom_rt_device_cap_note(ctx->device, cap, sizeof cap));
        return NULL;
    }
    loom_rt_buffer_write(buf, data, bytes);
    loom_fe_tensor *t = &ctx->tensors[slot];
    t->refs = 1;
    t->dtype = dtype;
    t->rank = rank;
    memcpy(t->shape, oshape, (size_t)rank * sizeof *oshape);
    t->buf = buf;
    t->loc = (loom_ir_loc){file, line, ctx->scope, false};
    return loom_fe_handle(ctx, slot);
}

LOOM_API loom_status loom_tensor_read(loom_context *ctx, loom_tensor *h, void *dst, size_t size) {
    LOOM_FE_USE(ctx, "tensor_read", LOOM_STATUS_BUSY);
    static const char op[] = "tensor_read";
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (!h)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, "tensor is NULL");
    loom_status why;
    int32_t slot = decode(ctx, h, &why);
    if (slot < 0) {
        record_bad_handle(ctx, why, NULL, 0, op);
        return why;
    }
    loom_fe_tensor *t = &ctx->tensors[slot];
    size_t bytes = (size_t)loom_ir_numel(t->rank, t->shape) * loom_dtype_size(t->dtype);
    char ty[LOOM_IR_TYPE_STR_MAX];
    if (!dst || size != bytes)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, t->loc.file, t->loc.line, op,
                             "%s: destination holds %zu bytes, the tensor %s has %zu",
                             dst ? "size mismatch" : "dst is NULL", size,
                             loom_ir_format_type(ty, sizeof ty, t->dtype, t->rank, t->shape), bytes);
    /* Its value may still be being computed, or be overwritten by the step in flight. */
    loom_fe_finish_inflight(ctx);
    bool pending = t->node_step == ctx->step && t->node >= 0; /* incl. a pending assignment */
    if (!t->buf || pending) {
        if (!pending)
            return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, t->loc.file, t->loc.line, op,
                                 "tensor has no value: the step that should have computed it "
                                 "failed");
        loom_rt_metrics_add(&ctx->metrics, LOOM_RT_METRIC_FORCED_READS, 1);
        if (ctx->debug)
            loom_fe_debug_forced_read(ctx, t);
        loom_status st = loom_fe_compute(ctx, 1, &slot, false);
        if (st == LOOM_OK)
            st = loom_fe_finish_inflight(ctx);
        if (st != LOOM_OK)
            return st;
    }
    return loom_rt_buffer_read(t->buf, dst, size);
}

/* retain/release take no context: find it through the handle's registry id. */
static loom_fe_tensor *lookup_for_refcount(loom_tensor *h, loom_context **out_ctx,
                                           const char *op) {
    if (!h)
        return NULL;
    loom_context *ctx = loom_fe_handle_context(h);
    if (!ctx)
        return NULL; /* its context is gone: nothing to record into */
    *out_ctx = ctx;
    return loom_fe_tensor_get(ctx, h, NULL, 0, op);
}

LOOM_API void loom_tensor_retain(loom_tensor *h) {
    LOOM_FE_USE(h ? loom_fe_handle_context(h) : NULL, "tensor_retain", );
    loom_context *ctx;
    loom_fe_tensor *t = lookup_for_refcount(h, &ctx, "tensor_retain");
    if (t)
        t->refs++;
}

LOOM_API void loom_tensor_release(loom_tensor *h) {
    LOOM_FE_USE(h ? loom_fe_handle_context(h) : NULL, "tensor_release", );
    loom_context *ctx;
    loom_fe_tensor *t = lookup_for_refcount(h, &ctx, "tensor_release");
    if (!t)
        return;
    if (t->refs <= 0) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, t->loc.file, t->loc.line, "tensor_release",
                      "released more often than retained (op results need no release unless "
                      "retained)");
        return;
    }
    if (--t->refs == 0 && !t->step_owned)
        loom_fe_tensor_free(ctx, (int32_t)(t - ctx->tensors));
}

/* Shape queries: a status instead of a recorded error, as they take no context. The type is
 * copied out under the in-use guard, as the slots may move once it is left. */
typedef struct {
    loom_dtype dtype;
    int32_t rank;
    int64_t shape[LOOM_MAX_RANK];
} tensor_type;

static const tensor_type *query(const loom_tensor *h, loom_status *st, tensor_type *out,
                                const char *op) {
    if (!h) {
        *st = LOOM_STATUS_INVALID_ARGUMENT;
        return NULL;
    }
    loom_context *ctx = loom_fe_handle_context(h);
    if (!ctx) {
        *st = LOOM_STATUS_STALE_HANDLE;
        return NULL;
    }
    loom_fe_use use __attribute__((cleanup(loom_fe_use_end)));
    if (!loom_fe_use_begin(&use, ctx, op)) {
        *st = LOOM_STATUS_BUSY;
        return NULL;
    }
    int32_t slot = decode(ctx, h, st);
    if (slot < 0)
        return NULL;
    const loom_fe_tensor *t = &ctx->tensors[slot];
    out->dtype = t->dtype;
    out->rank = t->rank;
    memcpy(out->shape, t->shape, (size_t)t->rank * sizeof *out->shape);
    return out;
}

LOOM_API loom_status loom_tensor_dtype(const loom_tensor *h, loom_dtype *out_dtype) {
    loom_status st = LOOM_OK;
    tensor_type ty;
    const tensor_type *t = query(h, &st, &ty, "tensor_dtype");
    if (t && out_dtype)
        *out_dtype = t->dtype;
    return t ? (out_dtype ? LOOM_OK : LOOM_STATUS_INVALID_ARGUMENT) : st;
}

LOOM_API loom_status loom_tensor_rank(const loom_tensor *h, int32_t *out_rank) {
    loom_status st = LOOM_OK;
    tensor_type ty;
    const tensor_type *t = query(h, &st, &ty, "tensor_rank");
    if (t && out_rank)
        *out_rank = t->rank;
    return t ? (out_rank ? LOOM_OK : LOOM_STATUS_INVALID_ARGUMENT) : st;
}

LOOM_API loom_status loom_tensor_shape(const loom_tensor *h, int64_t *out_shape) {
    loom_status st = LOOM_OK;
    tensor_type ty;
    const tensor_type *t = query(h, &st, &ty, "tensor_shape");
    if (t && out_shape)
        memcpy(out_shape, t->shape, (size_t)t->rank * sizeof *out_shape);
    return t ? (out_shape ? LOOM_OK : LOOM_STATUS_INVALID_ARGUMENT) : st;
}

LOOM_API loom_status loom_tensor_numel(const loom_tensor *h, int64_t *out_numel) {
    loom_status st = LOOM_OK;
    tensor_type ty;
    const tensor_type *t = query(h, &st, &ty, "tensor_numel");
    if (t && out_numel)
        *out_numel = loom_ir_numel(t->rank, t->shape);
    return t ? (out_numel ? LOOM_OK : LOOM_STATUS_INVALID_ARGUMENT) : st;
}

LOOM_API loom_status loom_assign_at(loom_context *ctx, loom_tensor *dst, loom_tensor *value,
                                    const char *file, int line) {
    LOOM_FE_USE(ctx, "assign", LOOM_STATUS_BUSY);
    static const char op[] = "assign";
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (!dst || !value)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op, "%s is NULL",
                             dst ? "value" : "dst");
    loom_fe_tensor *d = loom_fe_tensor_get(ctx, dst, file, line, op);
    loom_fe_tensor *v = loom_fe_tensor_get(ctx, value, file, line, op);
    if (!d || !v)
        return ctx->err;
    char td[LOOM_IR_TYPE_STR_MAX], tv[LOOM_IR_TYPE_STR_MAX];
    if (d->step_owned)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                             "dst is a result of this step; assign to a long-lived tensor");
    if (d->dtype != v->dtype || d->rank != v->rank ||
        memcmp(d->shape, v->shape, (size_t)d->rank * sizeof d->shape[0]) != 0)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                             "types differ: dst %s, value %s",
                             loom_ir_format_type(td, sizeof td, d->dtype, d->rank, d->shape),
                             loom_ir_format_type(tv, sizeof tv, v->dtype, v->rank, v->shape));
    int32_t dslot = (int32_t)(d - ctx->tensors);
    int32_t node = loom_fe_tensor_node(ctx, (int32_t)(v - ctx->tensors), file, line, op);
    if (node < 0)
        return ctx->err;
    d = &ctx->tensors[dslot]; /* tensor_node may not move slots, but stay safe */
    /* First assignment this step: remember it (once, even when a read computed an earlier
     * assignment of this step in between). */
    if (d->assigned_step != ctx->step) {
        if (!loom_ir_grow(&ctx->alloc, (void **)&ctx->assigned, &ctx->cap_assigned,
                          ctx->n_assigned + 1, sizeof *ctx->assigned))
            return loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, file, line, op, "out of memory");
        ctx->assigned[ctx->n_assigned++] = dslot;
        d->assigned_step = ctx->step;
    }
    d->node = node;
    d->node_step = ctx->step;
    return LOOM_OK;
}

bool loom_fe_type_of(loom_context *ctx, loom_tensor *t, const char *what, const char *file,
                     int line, const char *op, loom_dtype *dt, int32_t *rank, int64_t *shape) {
    if (!t) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "%s is NULL (from an earlier failed op?)", what);
        return false;
    }
    loom_fe_tensor *ft = loom_fe_tensor_get(ctx, t, file, line, op);
    if (!ft)
        return false;
    *dt = ft->dtype;
    *rank = ft->rank;
    memcpy(shape, ft->shape, sizeof ft->shape);
    return true;
}

bool loom_fe_norm_axis(loom_context *ctx, int32_t *axis, int32_t rank, const char *file, int line,
                       const char *op) {
    int32_t ax = *axis < 0 ? *axis + rank : *axis;
    if (ax < 0 || ax >= rank) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "axis %d is out of range for rank %d", (int)*axis, (int)rank);
        return false;
    }
    *axis = ax;
    return true;
}
