/* The IR text printer: one node a line in the MLIR-like format documented above
 * loom_ir_graph_print in ir.h, written through the caller's chunked callback. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

/* %.17g round-trips every double through strtod; inf and nan are spelled out so the text
 * does not depend on the C library's spelling. `shortest` (for messages) takes the fewest
 * digits that still read back as the same double: 0.0099, not 0.0099000000000000008. */
static void put_double(loom_ir_writer *p, double v, bool shortest) {
    if (isnan(v)) {
        loom_ir_writer_puts(p, signbit(v) ? "-nan" : "nan");
    } else if (isinf(v)) {
        loom_ir_writer_puts(p, v < 0 ? "-inf" : "inf");
    } else {
        char buf[32];
        for (int digits = shortest ? 1 : 17; digits <= 17; digits++) {
            snprintf(buf, sizeof buf, "%.*g", digits, v);
            if (strtod(buf, NULL) == v)
                break;
        }
        loom_ir_writer_puts(p, buf);
    }
}

/* A quoted string: quotes and backslashes escaped, control bytes as \xHH so that any file
 * name survives a round trip through the parser. */
static void put_quoted(loom_ir_writer *p, const char *s) {
    loom_ir_writer_put(p, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            loom_ir_writer_put(p, e, 2);
        } else if (*c < 0x20 || *c == 0x7f) {
            loom_ir_writer_printf(p, "\\x%02x", (unsigned)*c);
        } else {
            loom_ir_writer_put(p, (const char *)c, 1);
        }
    }
    loom_ir_writer_put(p, "\"", 1);
}

/* The op's own attributes, without braces; false when it has none. */
/* A window's {h, w} pairs: the kernel first where it is an attribute (pooling), then
 * stride, padding and dilation. */
static void put_window(loom_ir_writer *p, const loom_ir_conv *c, bool kernel) {
    static const char *const names[4] = {"kernel", "stride", "padding", "dilation"};
    const int64_t *v[4] = {c->kernel, c->stride, c->padding, c->dilation};
    for (int k = kernel ? 0 : 1; k < 4; k++)
        loom_ir_writer_printf(p, "%s%s = [%lld, %lld]", k > (kernel ? 0 : 1) ? ", " : "", names[k],
                              (long long)v[k][0], (long long)v[k][1]);
}

static bool put_attr_body(loom_ir_writer *p, const loom_ir_node *n, bool shortest) {
    switch (loom_ir_op_table[n->op].attrs) {
    case LOOM_IR_ATTRS_NONE: return false;
    case LOOM_IR_ATTRS_INDEX:
        loom_ir_writer_printf(p, "index = %lld", (long long)n->attrs.index);
        return true;
    case LOOM_IR_ATTRS_VALUE:
        loom_ir_writer_puts(p, "value = ");
        put_double(p, n->attrs.value, shortest);
        return true;
    case LOOM_IR_ATTRS_PERM:
        loom_ir_writer_puts(p, "perm = [");
        for (int32_t i = 0; i < n->rank && i < LOOM_MAX_RANK; i++)
            loom_ir_writer_printf(p, i ? ", %d" : "%d", (int)n->attrs.perm[i]);
        loom_ir_writer_puts(p, "]");
        return true;
    case LOOM_IR_ATTRS_AXES: {
        loom_ir_writer_puts(p, "axes = [");
        bool first = true;
        for (int32_t i = 0; i < 32; i++) {
            if (n->attrs.axes & (1u << i)) {
                loom_ir_writer_printf(p, first ? "%d" : ", %d", (int)i);
                first = false;
            }
        }
        loom_ir_writer_printf(p, "], keepdim = %s", n->attrs.keepdim ? "true" : "false");
        return true;
    }
    case LOOM_IR_ATTRS_SLICE:
    case LOOM_IR_ATTRS_PAD: {
        bool pad = loom_ir_op_table[n->op].attrs == LOOM_IR_ATTRS_PAD;
        int32_t rank = n->rank < 0 ? 0 : n->rank > LOOM_MAX_RANK ? LOOM_MAX_RANK : n->rank;
        loom_ir_writer_puts(p, pad ? "low = [" : "start = [");
        for (int32_t i = 0; i < rank; i++)
            loom_ir_writer_printf(p, i ? ", %lld" : "%lld", (long long)n->attrs.start[i]);
        loom_ir_writer_puts(p, pad ? "], interior = [" : "], stride = [");
        for (int32_t i = 0; i < rank; i++)
            loom_ir_writer_printf(p, i ? ", %lld" : "%lld", (long long)n->attrs.step[i]);
        loom_ir_writer_puts(p, "]");
        if (pad) {
            loom_ir_writer_puts(p, ", value = ");
            put_double(p, n->attrs.value, shortest);
        }
        return true;
    }
    case LOOM_IR_ATTRS_AXIS:
        loom_ir_writer_printf(p, "axis = %lld", (long long)n->attrs.index);
        return true;
    case LOOM_IR_ATTRS_REDUCE:
        loom_ir_writer_printf(p, "reduce = %s, scale = ", loom_ir_reduce_op_name(n->attrs.index));
        put_double(p, n->attrs.value, shortest);
        return true;
    case LOOM_IR_ATTRS_ATTENTION:
        loom_ir_writer_printf(p, "causal = %s, scale = ", n->attrs.index ? "true" : "false");
        put_double(p, n->attrs.value, shortest);
        if (n->attrs.dropout != 0) { /* optional: printed only where there is one */
            loom_ir_writer_printf(p, ", dropout = ");
            put_double(p, n->attrs.dropout, shortest);
        }
        return true;
    case LOOM_IR_ATTRS_ROOT:
        loom_ir_writer_printf(p, "root = %lld", (long long)n->attrs.index);
        return true;
    case LOOM_IR_ATTRS_WORLD:
        loom_ir_writer_printf(p, "world = %lld", (long long)n->attrs.index);
        return true;
    case LOOM_IR_ATTRS_CONV: {
        const loom_ir_conv *c = &n->attrs.conv;
        put_window(p, c, false);
        loom_ir_writer_printf(p, ", groups = %lld", (long long)c->groups);
        return true;
    }
    case LOOM_IR_ATTRS_POOL: put_window(p, &n->attrs.conv, true); return true;
    case LOOM_IR_ATTRS_COUNT_: return false;
    }
    return false;
}

bool loom_ir_write_attrs(loom_ir_writer *p, const loom_ir_node *n, bool shortest) {
    if ((unsigned)n->op >= LOOM_IR_OP_COUNT_)
        return false;
    bool tagged = n->attrs.autocast != LOOM_DTYPE_F32;
    bool body = put_attr_body(p, n, shortest);
    if (tagged)
        loom_ir_writer_printf(p, "%sautocast = %s", body ? ", " : "",
                              loom_dtype_name(n->attrs.autocast));
    return body || tagged;
}

/* " {attributes, autocast = bf16}", or nothing when the node has neither. */
static void put_attrs(loom_ir_writer *p, const loom_ir_node *n) {
    if (loom_ir_op_table[n->op].attrs == LOOM_IR_ATTRS_NONE && n->attrs.autocast == LOOM_DTYPE_F32)
        return;
    loom_ir_writer_puts(p, " {");
    loom_ir_write_attrs(p, n, false);
    loom_ir_writer_puts(p, "}");
}

char *loom_ir_format_loc(char *buf, size_t size, loom_ir_loc loc) {
    if (size == 0)
        return buf;
    buf[0] = '\0';
    const char *base = loc.file ? strrchr(loc.file, '/') : NULL;
    base = base ? base + 1 : loc.file;
    const char *grad = loc.backward ? ".grad" : "";
    if (loc.scope && loc.file)
        snprintf(buf, size, "%s%s (%s:%d)", loc.scope, grad, base, (int)loc.line);
    else if (loc.scope)
        snprintf(buf, size, "%s%s", loc.scope, grad);
    else if (loc.file)
        snprintf(buf, size, "%s:%d", base, (int)loc.line);
    return buf;
}

static void put_node(loom_ir_writer *p, int32_t id, const loom_ir_node *n) {
    bool known = (unsigned)n->op < LOOM_IR_OP_COUNT_;
    loom_ir_writer_printf(p, "  %%%d = %s", (int)id, loom_ir_op_name(n->op));
    for (int32_t k = 0; k < n->n_inputs; k++)
        loom_ir_writer_printf(p, k ? ", %%%d" : " %%%d", (int)n->inputs[k]);
    if (known)
        put_attrs(p, n);
    char type[LOOM_IR_TYPE_STR_MAX];
    int32_t rank = n->rank < 0 ? 0 : n->rank > LOOM_MAX_RANK ? LOOM_MAX_RANK : n->rank;
    loom_ir_writer_puts(p, " : ");
    loom_ir_writer_puts(p, loom_ir_format_type(type, sizeof type, n->dtype, rank, n->shape));
    if (n->loc.file || n->loc.scope || n->loc.backward) {
        loom_ir_writer_puts(p, " loc(");
        const char *sep = "";
        if (n->loc.file) {
            put_quoted(p, n->loc.file);
            loom_ir_writer_printf(p, ":%d", (int)n->loc.line);
            sep = ", ";
        }
        if (n->loc.scope) {
            loom_ir_writer_printf(p, "%sscope = ", sep);
            put_quoted(p, n->loc.scope);
            sep = ", ";
        }
        if (n->loc.backward)
            loom_ir_writer_printf(p, "%sbackward", sep);
        loom_ir_writer_puts(p, ")");
    }
    loom_ir_writer_puts(p, "\n");
}

char *loom_ir_format_node(char *buf, size_t size, const loom_ir_node *n, int32_t id) {
    if (size == 0)
        return buf;
    buf[0] = '\0';
    loom_ir_fixed_buf f = {buf, size, 0, 2}; /* put_node's indent dropped */
    loom_ir_writer p = {.write = loom_ir_fixed_buf_write, .ud = &f};
    put_node(&p, id, n);
    loom_ir_writer_flush(&p);
    if (f.len > 0 && buf[f.len - 1] == '\n')
        buf[f.len - 1] = '\0';
    return buf;
}

loom_status loom_ir_graph_print(const loom_ir_graph *g, loom_ir_write_fn write, void *ud) {
    if (!g || !write)
        return LOOM_STATUS_INVALID_ARGUMENT;
    loom_ir_writer p = {.write = write, .ud = ud};
    loom_ir_writer_puts(&p, "loom.graph {\n");
    for (int32_t i = 0; i < g->n_nodes; i++)
        put_node(&p, i, &g->nodes[i]);
    loom_ir_writer_puts(&p, "  return");
    for (int32_t o = 0; o < g->n_outputs; o++) {
        loom_ir_writer_printf(&p, o ? ", %%%d" : " %%%d", (int)g->outputs[o].node);
        if (g->outputs[o].alias >= 0)
            loom_ir_writer_printf(&p, " {alias = %d}", (int)g->outputs[o].alias);
    }
    loom_ir_writer_puts(&p, "\n}\n");
    loom_ir_writer_flush(&p);
    return LOOM_OK;
}
