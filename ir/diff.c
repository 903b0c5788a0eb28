/* Structural diff of two IR graphs: nodes matched by structure rather than id, then the
 * differences of matched pairs, unmatched nodes and outputs listed with source locations.
 * `loom-ir diff` prints it; the recompilation explainer names a cache miss's cause with it. */
#include <stdlib.h>
#include <string.h>

#include "ir.h"

/* A candidate lookup beyond this many entries of one key gives up: it bounds the work on
 * pathological graphs (thousands of nodes with one op and one operand) to linear. */
enum { MAX_CANDIDATES = 32 };

static inline uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 31);
}

static uint64_t bits_of(double v) {
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static bool same_type(const loom_ir_node *x, const loom_ir_node *y) {
    return x->dtype == y->dtype && x->rank == y->rank &&
           memcmp(x->shape, y->shape, (size_t)x->rank * sizeof x->shape[0]) == 0;
}

static bool same_local(const loom_ir_node *x, const loom_ir_node *y) {
    return x->op == y->op && same_type(x, y) && loom_ir_attrs_equal(x, y);
}

/* ---- matching ------------------------------------------------------------------------------ */

typedef struct cand {
    uint64_t key;
    int32_t id;
} cand;

/* The first graph's nodes sorted by key (then id), each key's run found by binary search;
 * cursor[i], for a run starting at i, skips the run's leading entries already matched. */
typedef struct cand_index {
    cand *v;
    int32_t *cursor;
    int32_t n;
} cand_index;

typedef struct matcher {
    const loom_ir_graph *a, *b;
    int32_t *a_to_b, *b_to_a;
    int32_t n_matched;
    cand_index idx;
    const loom_allocator *alloc;
} matcher;

static int cmp_cand(const void *p, const void *q) {
    const cand *x = p, *y = q;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Exact keys cover the node's own properties and its operands; fuzzy keys only the op and
 * the operands (and an input's index: inputs are identified by it). Constants and iotas have
 * no fuzzy identity: they are paired top-down, by their users. `map` translates operand ids
 * into the first graph's (NULL: they are the first graph's). false when an operand is
 * unmatched or the node has no fuzzy identity. */
static bool node_key(const loom_ir_node *n, const int32_t *map, bool exact, uint64_t *out) {
    if (!exact && (n->op == LOOM_IR_OP_CONSTANT || n->op == LOOM_IR_OP_IOTA))
        return false;
    uint64_t h = exact ? loom_ir_node_local_key(n) : mix((uint64_t)n->op, 0);
    if (!exact && n->op == LOOM_IR_OP_INPUT)
        h = mix(h, (uint64_t)n->attrs.index);
    h = mix(h, (uint64_t)(uint32_t)n->n_inputs);
    for (int32_t i = 0; i < n->n_inputs; i++) {
        int32_t o = map ? map[n->inputs[i]] : n->inputs[i];
        if (o < 0)
            return false;
        h = mix(h, (uint64_t)(uint32_t)o);
    }
    *out = h;
    return true;
}

static void index_free(matcher *m) {
    loom_ir_free(m->alloc, m->idx.v, (size_t)m->a->n_nodes * sizeof *m->idx.v);
    loom_ir_free(m->alloc, m->idx.cursor, (size_t)m->a->n_nodes * sizeof *m->idx.cursor);
    m->idx = (cand_index){0};
}

static bool index_build(matcher *m, bool exact) {
    index_free(m);
    int32_t n = m->a->n_nodes;
    if (n == 0)
        return true;
    m->idx.v = loom_ir_alloc(m->alloc, (size_t)n * sizeof *m->idx.v);
    m->idx.cursor = loom_ir_alloc(m->alloc, (size_t)n * sizeof *m->idx.cursor);
    if (!m->idx.v || !m->idx.cursor) {
        index_free(m);
        return false;
    }
    for (int32_t i = 0; i < n; i++) {
        uint64_t key;
        if (node_key(&m->a->nodes[i], NULL, exact, &key))
            m->idx.v[m->idx.n++] = (cand){key, i};
    }
    qsort(m->idx.v, (size_t)m->idx.n, sizeof *m->idx.v, cmp_cand);
    for (int32_t i = 0; i < m->idx.n; i++)
        m->idx.cursor[i] = i;
    return true;
}

static bool operands_match(const matcher *m, const loom_ir_node *x, const loom_ir_node *y) {
    if (x->n_inputs != y->n_inputs)
        return false;
    for (int32_t i = 0; i < y->n_inputs; i++)
        if (x->inputs[i] != m->b_to_a[y->inputs[i]])
            return false;
    return true;
}

/* The unmatched node of the first graph with this key that pairs with y: for an exact key one
 * equal to y, otherwise preferably equal, else the first of the same op and operands. */
static int32_t index_find(matcher *m, uint64_t key, const loom_ir_node *y, bool exact) {
    int32_t lo = 0, hi = m->idx.n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (m->idx.v[mid].key < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == m->idx.n || m->idx.v[lo].key != key)
        return -1;
    int32_t i = m->idx.cursor[lo];
    while (i < m->idx.n && m->idx.v[i].key == key && m->a_to_b[m->idx.v[i].id] >= 0)
        i++;
    m->idx.cursor[lo] = i;
    int32_t best = -1;
    for (int32_t seen = 0; i < m->idx.n && m->idx.v[i].key == key && seen < MAX_CANDIDATES;
         i++, seen++) {
        int32_t id = m->idx.v[i].id;
        const loom_ir_node *x = &m->a->nodes[id];
        if (m->a_to_b[id] >= 0 || x->op != y->op || !operands_match(m, x, y))
            continue;
        if (!exact && x->op == LOOM_IR_OP_INPUT && x->attrs.index != y->attrs.index)
            continue;
        if (same_local(x, y))
            return id;
        if (!exact && best < 0)
            best = id;
    }
    return best;
}

static void pair(matcher *m, int32_t x, int32_t y) {
    m->a_to_b[x] = y;
    m->b_to_a[y] = x;
    m->n_matched++;
}

/* Bottom-up: every unmatched node of the second graph, in order, whose operands are matched
 * looks for its counterpart. false on out-of-memory. */
static bool match_up(matcher *m, bool exact) {
    if (!index_build(m, exact))
        return false;
    for (int32_t y = 0; y < m->b->n_nodes; y++) {
        uint64_t key;
        if (m->b_to_a[y] >= 0 || !node_key(&m->b->nodes[y], m->b_to_a, exact, &key))
            continue;
        int32_t x = index_find(m, key, &m->b->nodes[y], exact);
        if (x >= 0)
            pair(m, x, y);
    }
    index_free(m);
    return true;
}

static void try_pair_down(matcher *m, int32_t x, int32_t y) {
    const loom_ir_node *nx = &m->a->nodes[x], *ny = &m->b->nodes[y];
    if (m->a_to_b[x] < 0 && m->b_to_a[y] < 0 && nx->op == ny->op && nx->n_inputs == ny->n_inputs)
        pair(m, x, y);
}

/* Top-down: outputs by position, then the operands of matched nodes by position, from the
 * last node back (operands precede users, so one pass reaches every depth). */
static void match_down(matcher *m) {
    int32_t n_out = m->a->n_outputs < m->b->n_outputs ? m->a->n_outputs : m->b->n_outputs;
    for (int32_t k = 0; k < n_out; k++)
        try_pair_down(m, m->a->outputs[k].node, m->b->outputs[k].node);
    for (int32_t y = m->b->n_nodes - 1; y >= 0; y--) {
        int32_t x = m->b_to_a[y];
        if (x < 0)
            continue;
        const loom_ir_node *nx = &m->a->nodes[x], *ny = &m->b->nodes[y];
        for (int32_t i = 0; i < nx->n_inputs && i < ny->n_inputs; i++)
            try_pair_down(m, nx->inputs[i], ny->inputs[i]);
    }
}

/* Last resort for sources that nothing paired (a constant without users, or whose users are
 * all new): the k-th leftover constant (iota) of a type in one graph with the k-th of the
 * same type in the other, so a changed value still reads as a changed constant. */
static void match_leftover_sources(matcher *m, loom_ir_op op) {
    int32_t x = 0, y = 0;
    for (;;) {
        while (x < m->a->n_nodes && (m->a_to_b[x] >= 0 || m->a->nodes[x].op != op))
            x++;
        while (y < m->b->n_nodes && (m->b_to_a[y] >= 0 || m->b->nodes[y].op != op))
            y++;
        if (x == m->a->n_nodes || y == m->b->n_nodes)
            return;
        if (same_type(&m->a->nodes[x], &m->b->nodes[y]))
            pair(m, x, y);
        else if (x < y) /* skip the earlier one: types differ, so they are not the same value */
            x++;
        else
            y++;
    }
}

static bool match(matcher *m) {
    if (!match_up(m, true))
        return false;
    /* Each round can only add pairs; a few rounds settle real graphs (a second one is needed
     * when a top-down pair unlocks a bottom-up one), and the cap keeps the bound linear. */
    for (int round = 0; round < 4; round++) {
        int32_t before = m->n_matched;
        if (!match_up(m, false))
            return false;
        match_down(m);
        if (m->n_matched == before)
            break;
    }
    match_leftover_sources(m, LOOM_IR_OP_CONSTANT);
    match_leftover_sources(m, LOOM_IR_OP_IOTA);
    return true;
}

/* ---- items --------------------------------------------------------------------------------- */

static bool push_item(loom_ir_diff *df, loom_ir_diff_item it) {
    if (!loom_ir_grow(&df->alloc, (void **)&df->items, &df->cap_items, df->n_items + 1,
                      sizeof *df->items))
        return false;
    df->items[df->n_items++] = it;
    return true;
}

static loom_ir_diff_item node_item(loom_ir_diff_kind kind, int32_t x, int32_t y) {
    return (loom_ir_diff_item){.kind = kind, .a = x, .b = y, .output = -1};
}

/* Whether the matched pair (x, y) takes other operands while every operand on both sides is
 * matched (a new or removed operand is reported as such, not again here). */
static bool operands_changed(const loom_ir_diff *df, int32_t x, int32_t y) {
    const loom_ir_node *nx = &df->a->nodes[x], *ny = &df->b->nodes[y];
    bool changed = nx->n_inputs != ny->n_inputs;
    for (int32_t i = 0; i < nx->n_inputs; i++)
        if (df->a_to_b[nx->inputs[i]] < 0)
            return false;
    for (int32_t i = 0; i < ny->n_inputs; i++) {
        int32_t o = df->b_to_a[ny->inputs[i]];
        if (o < 0)
            return false;
        if (i < nx->n_inputs && nx->inputs[i] != o)
            changed = true;
    }
    return changed;
}

/* Whether the type change of the matched pair (x, y) follows from another change: its own
 * attributes (a reduction's axes) or an operand that is new or changed type. */
static bool type_change_derived(const loom_ir_diff *df, int32_t x, int32_t y, const bool *changed) {
    const loom_ir_node *ny = &df->b->nodes[y];
    if (!loom_ir_attrs_equal(&df->a->nodes[x], ny))
        return true;
    for (int32_t i = 0; i < ny->n_inputs; i++)
        if (changed[ny->inputs[i]])
            return true;
    return false;
}

/* Lists the items in the documented order. changed[y]: node y of the second graph is new or
 * has another type (its users' type changes are then derived). */
static bool list_items(loom_ir_diff *df, bool *changed) {
    const loom_ir_graph *a = df->a, *b = df->b;
    for (int32_t y = 0; y < b->n_nodes; y++) {
        int32_t x = df->b_to_a[y];
        const loom_ir_node *ny = &b->nodes[y];
        changed[y] = x < 0;
        if (x < 0) {
            if (!push_item(df, node_item(LOOM_IR_DIFF_ADDED, -1, y)))
                return false;
            continue;
        }
        const loom_ir_node *nx = &a->nodes[x];
        bool attrs = !loom_ir_attrs_equal(nx, ny);
        if (!same_type(nx, ny)) {
            changed[y] = true;
            if (!type_change_derived(df, x, y, changed) &&
                !push_item(df, node_item(LOOM_IR_DIFF_TYPE, x, y)))
                return false;
        }
        bool value =
            ny->op == LOOM_IR_OP_CONSTANT && bits_of(nx->attrs.value) != bits_of(ny->attrs.value);
        if (attrs &&
            !push_item(df, node_item(value ? LOOM_IR_DIFF_CONSTANT : LOOM_IR_DIFF_ATTRS, x, y)))
            return false;
        if (operands_changed(df, x, y) && !push_item(df, node_item(LOOM_IR_DIFF_OPERANDS, x, y)))
            return false;
    }
    for (int32_t x = 0; x < a->n_nodes; x++)
        if (df->a_to_b[x] < 0 && !push_item(df, node_item(LOOM_IR_DIFF_REMOVED, x, -1)))
            return false;
    int32_t n_out = a->n_outputs > b->n_outputs ? a->n_outputs : b->n_outputs;
    for (int32_t k = 0; k < n_out; k++) {
        const loom_ir_output *oa = k < a->n_outputs ? &a->outputs[k] : NULL;
        const loom_ir_output *ob = k < b->n_outputs ? &b->outputs[k] : NULL;
        if (oa && ob && df->a_to_b[oa->node] == ob->node && oa->alias == ob->alias)
            continue;
        loom_ir_diff_item it = {.kind = LOOM_IR_DIFF_OUTPUT,
                                .a = oa ? oa->node : -1,
                                .b = ob ? ob->node : -1,
                                .output = k};
        if (!push_item(df, it))
            return false;
    }
    for (int32_t y = 0; y < b->n_nodes; y++) {
        int32_t x = df->b_to_a[y];
        if (x < 0 || same_type(&a->nodes[x], &b->nodes[y]))
            continue;
        if (type_change_derived(df, x, y, changed)) {
            loom_ir_diff_item it = node_item(LOOM_IR_DIFF_TYPE, x, y);
            it.derived = true;
            if (!push_item(df, it))
                return false;
        }
    }
    return true;
}

/* ---- the diff object ----------------------------------------------------------------------- */

void loom_ir_diff_init(loom_ir_diff *df, const loom_allocator *a) {
    *df = (loom_ir_diff){.alloc = *a};
}

static void release_matching(loom_ir_diff *df) {
    loom_ir_free(&df->alloc, df->a_to_b, (size_t)df->n_a * sizeof *df->a_to_b);
    loom_ir_free(&df->alloc, df->b_to_a, (size_t)df->n_b * sizeof *df->b_to_a);
    df->a_to_b = df->b_to_a = NULL;
    df->n_a = df->n_b = 0;
    df->n_items = 0;
}

void loom_ir_diff_deinit(loom_ir_diff *df) {
    if (!df)
        return;
    release_matching(df);
    loom_ir_free(&df->alloc, df->items, (size_t)df->cap_items * sizeof *df->items);
    df->items = NULL;
    df->cap_items = 0;
}

/* Operands must precede their users and outputs name nodes: the matcher relies on both. */
static loom_status check_graph(const loom_ir_graph *g, const char *which, loom_ir_diag *d) {
    for (int32_t i = 0; i < g->n_nodes; i++)
        for (int32_t k = 0; k < g->nodes[i].n_inputs; k++)
            if (g->nodes[i].inputs[k] < 0 || g->nodes[i].inputs[k] >= i)
                return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                        "diff: %s graph: %%%d uses %%%d, not an earlier node",
                                        which, (int)i, (int)g->nodes[i].inputs[k]);
    for (int32_t o = 0; o < g->n_outputs; o++)
        if (g->outputs[o].node < 0 || g->outputs[o].node >= g->n_nodes)
            return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                    "diff: %s graph: output %d names %%%d, not a node", which,
                                    (int)o, (int)g->outputs[o].node);
    return LOOM_OK;
}

loom_status loom_ir_diff_compute(loom_ir_diff *df, const loom_ir_graph *a, const loom_ir_graph *b,
                                 loom_ir_diag *d) {
    if (!df || !a || !b)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "diff: NULL argument");
    release_matching(df);
    loom_status st = check_graph(a, "first", d);
    if (st == LOOM_OK)
        st = check_graph(b, "second", d);
    if (st != LOOM_OK)
        return st;
    df->a = a;
    df->b = b;
    df->n_a = a->n_nodes;
    df->n_b = b->n_nodes;
    df->a_to_b = loom_ir_alloc(&df->alloc, (size_t)df->n_a * sizeof *df->a_to_b);
    df->b_to_a = loom_ir_alloc(&df->alloc, (size_t)df->n_b * sizeof *df->b_to_a);
    bool *changed = loom_ir_alloc(&df->alloc, (size_t)df->n_b * sizeof *changed);
    bool ok =
        (df->a_to_b || df->n_a == 0) && (df->b_to_a || df->n_b == 0) && (changed || df->n_b == 0);
    if (ok) {
        for (int32_t i = 0; i < df->n_a; i++)
            df->a_to_b[i] = -1;
        for (int32_t i = 0; i < df->n_b; i++)
            df->b_to_a[i] = -1;
        matcher m = {
            .a = a, .b = b, .a_to_b = df->a_to_b, .b_to_a = df->b_to_a, .alloc = &df->alloc};
        ok = match(&m) && list_items(df, changed);
    }
    loom_ir_free(&df->alloc, changed, (size_t)df->n_b * sizeof *changed);
    if (!ok) {
        release_matching(df);
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY,
                                "diff: out of memory comparing graphs of %d and %d nodes",
                                (int)a->n_nodes, (int)b->n_nodes);
    }
    return LOOM_OK;
}

/* ---- text ---------------------------------------------------------------------------------- */

/* "%7 matmul at train.c:88"; inputs add their index: "%0 input 0 at train.c:80". */
static void put_node(loom_ir_writer *w, const loom_ir_graph *g, int32_t id, int32_t shown_id) {
    const loom_ir_node *n = &g->nodes[id];
    loom_ir_writer_printf(w, "%%%d %s", (int)shown_id, loom_ir_op_name(n->op));
    if (n->op == LOOM_IR_OP_INPUT)
        loom_ir_writer_printf(w, " %lld", (long long)n->attrs.index);
    char loc[LOOM_IR_LOC_STR_MAX];
    if (*loom_ir_format_loc(loc, sizeof loc, n->loc)) {
        loom_ir_writer_puts(w, " at ");
        loom_ir_writer_puts(w, loc);
    }
}

static void put_type(loom_ir_writer *w, const loom_ir_node *n) {
    char type[LOOM_IR_TYPE_STR_MAX];
    loom_ir_writer_puts(w, loom_ir_format_type(type, sizeof type, n->dtype, n->rank, n->shape));
}

static void put_attrs_braced(loom_ir_writer *w, const loom_ir_node *n) {
    loom_ir_writer_puts(w, "{");
    loom_ir_write_attrs(w, n, true);
    loom_ir_writer_puts(w, "}");
}

/* A node of the first graph, by its counterpart's id in the second when it has one. */
static void put_a_node(loom_ir_writer *w, const loom_ir_diff *df, int32_t x) {
    int32_t y = df->a_to_b[x];
    if (y >= 0) {
        put_node(w, df->b, y, y);
    } else {
        put_node(w, df->a, x, x);
        loom_ir_writer_puts(w, ", removed");
    }
}

static void put_operands(loom_ir_writer *w, const loom_ir_diff *df, const loom_ir_node *n,
                         bool first_graph) {
    for (int32_t i = 0; i < n->n_inputs; i++)
        loom_ir_writer_printf(w, i ? ", %%%d" : "%%%d",
                              (int)(first_graph ? df->a_to_b[n->inputs[i]] : n->inputs[i]));
}

static void put_alias(loom_ir_writer *w, int32_t alias) {
    if (alias >= 0)
        loom_ir_writer_printf(w, "alias = %d", (int)alias);
    else
        loom_ir_writer_puts(w, "no alias");
}

static void put_output_item(loom_ir_writer *w, const loom_ir_diff *df,
                            const loom_ir_diff_item *it) {
    loom_ir_writer_printf(w, "output %d ", (int)it->output);
    if (it->b < 0) {
        loom_ir_writer_puts(w, "was removed: ");
        put_a_node(w, df, it->a);
        return;
    }
    if (it->a < 0) {
        loom_ir_writer_puts(w, "is new: ");
        put_node(w, df->b, it->b, it->b);
        return;
    }
    if (df->a_to_b[it->a] != it->b) {
        loom_ir_writer_puts(w, "is ");
        put_node(w, df->b, it->b, it->b);
        loom_ir_writer_puts(w, " (was ");
        put_a_node(w, df, it->a);
        loom_ir_writer_puts(w, ")");
        return;
    }
    loom_ir_writer_puts(w, "(");
    put_node(w, df->b, it->b, it->b);
    loom_ir_writer_puts(w, ") has ");
    put_alias(w, df->b->outputs[it->output].alias);
    loom_ir_writer_puts(w, " (was ");
    put_alias(w, df->a->outputs[it->output].alias);
    loom_ir_writer_puts(w, ")");
}

static void put_item(loom_ir_writer *w, const loom_ir_diff *df, const loom_ir_diff_item *it) {
    const loom_ir_node *nx = it->a >= 0 ? &df->a->nodes[it->a] : NULL;
    const loom_ir_node *ny = it->b >= 0 ? &df->b->nodes[it->b] : NULL;
    switch (it->kind) {
    case LOOM_IR_DIFF_TYPE:
        put_node(w, df->b, it->b, it->b);
        loom_ir_writer_puts(w, " has ");
        put_type(w, ny);
        loom_ir_writer_puts(w, " (was ");
        put_type(w, nx);
        loom_ir_writer_puts(w, it->derived ? ", following the changes above)" : ")");
        return;
    case LOOM_IR_DIFF_ATTRS:
        put_node(w, df->b, it->b, it->b);
        loom_ir_writer_puts(w, " has ");
        put_attrs_braced(w, ny);
        loom_ir_writer_puts(w, " (was ");
        put_attrs_braced(w, nx);
        loom_ir_writer_puts(w, ")");
        return;
    case LOOM_IR_DIFF_CONSTANT:
        put_node(w, df->b, it->b, it->b);
        loom_ir_writer_puts(w, " is a constant that changes between graphs: ");
        loom_ir_write_attrs(w, ny, true);
        loom_ir_writer_puts(w, " (was ");
        loom_ir_write_attrs(w, nx, true);
        loom_ir_writer_puts(w, ")");
        return;
    case LOOM_IR_DIFF_OPERANDS:
        put_node(w, df->b, it->b, it->b);
        loom_ir_writer_puts(w, " takes ");
        put_operands(w, df, ny, false);
        loom_ir_writer_puts(w, " (was ");
        put_operands(w, df, nx, true);
        loom_ir_writer_puts(w, ")");
        return;
    case LOOM_IR_DIFF_ADDED:
        put_node(w, df->b, it->b, it->b);
        loom_ir_writer_puts(w, " is new: ");
        put_type(w, ny);
        return;
    case LOOM_IR_DIFF_REMOVED:
        put_node(w, df->a, it->a, it->a);
        loom_ir_writer_puts(w, " was removed: ");
        put_type(w, nx);
        loom_ir_writer_puts(w, " (an id of the first graph)");
        return;
    case LOOM_IR_DIFF_OUTPUT: put_output_item(w, df, it); return;
    case LOOM_IR_DIFF_COUNT_: return;
    }
}

char *loom_ir_diff_format_item(const loom_ir_diff *df, int32_t i, char *buf, size_t size) {
    if (size == 0)
        return buf;
    buf[0] = '\0';
    if (!df || i < 0 || i >= df->n_items)
        return buf;
    loom_ir_fixed_buf f = {buf, size, 0, 0};
    loom_ir_writer w = {.write = loom_ir_fixed_buf_write, .ud = &f};
    put_item(&w, df, &df->items[i]);
    loom_ir_writer_flush(&w);
    return buf;
}

void loom_ir_diff_print(const loom_ir_diff *df, int32_t max_items, loom_ir_write_fn write,
                        void *ud) {
    if (!df || !write)
        return;
    loom_ir_writer w = {.write = write, .ud = ud};
    int32_t n = max_items >= 0 && max_items < df->n_items ? max_items : df->n_items;
    for (int32_t i = 0; i < n; i++) {
        put_item(&w, df, &df->items[i]);
        loom_ir_writer_puts(&w, "\n");
    }
    if (n < df->n_items)
        loom_ir_writer_printf(&w, "... and %d more differences\n", (int)(df->n_items - n));
    loom_ir_writer_flush(&w);
}

loom_status loom_ir_graph_diff(const loom_ir_graph *a, const loom_ir_graph *b, int32_t max_items,
                               loom_ir_write_fn write, void *ud, int32_t *out_n_differences,
                               loom_ir_diag *d) {
    if (!a || !b || !write)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "diff: NULL argument");
    loom_ir_diff df;
    loom_ir_diff_init(&df, &a->alloc);
    loom_status st = loom_ir_diff_compute(&df, a, b, d);
    if (st == LOOM_OK)
        loom_ir_diff_print(&df, max_items, write, ud);
    if (out_n_differences)
        *out_n_differences = st == LOOM_OK ? df.n_items : 0;
    loom_ir_diff_deinit(&df);
    return st;
}

/* ---- distance ------------------------------------------------------------------------------ */

void loom_ir_graph_sketch(const loom_ir_graph *g, loom_ir_sketch *out) {
    memset(out, 0, sizeof *out);
    for (int32_t i = 0; i < g->n_nodes; i++)
        out->count[loom_ir_node_local_key(&g->nodes[i]) % LOOM_IR_SKETCH_BUCKETS]++;
    out->n_outputs = g->n_outputs;
}

int64_t loom_ir_sketch_distance(const loom_ir_sketch *a, const loom_ir_sketch *b) {
    int64_t dist = llabs((long long)a->n_outputs - b->n_outputs);
    for (int i = 0; i < LOOM_IR_SKETCH_BUCKETS; i++)
        dist += a->count[i] > b->count[i] ? a->count[i] - b->count[i] : b->count[i] - a->count[i];
    return dist;
}

int64_t loom_ir_graph_distance(const loom_ir_graph *a, const loom_ir_graph *b) {
    loom_ir_sketch sa, sb;
    loom_ir_graph_sketch(a, &sa);
    loom_ir_graph_sketch(b, &sb);
    return loom_ir_sketch_distance(&sa, &sb);
}
