/* loom-ir: inspect IR text files (as LOOM_DUMP writes them): print in canonical form,
 * verify, summarize, export to Graphviz, hash, diff two graphs, run pass pipelines and show
 * execution plans. Every command takes --help, reads '-' as standard input and exits 2 on
 * usage errors. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "loom_ir_exec.h"
#include "passes/passes.h"

enum { EXIT_OK = 0, EXIT_INVALID = 1, EXIT_USAGE = 2 };

/* A subcommand: its usage line (after "loom-ir "), what it does, and how it runs on the
 * arguments after its name. */
typedef struct command {
    const char *name;
    const char *usage;
    const char *summary; /* one line for `loom-ir --help` */
    const char *help;
    int (*run)(const struct command *c, int argc, char **argv);
} command;

/* `--help`: the command's usage and description on stdout. */
static int command_help(const command *c) {
    printf("usage: loom-ir %s\n\n%s", c->usage, c->help);
    if (strstr(c->usage, "FILE"))
        fputs("\nFILE may be '-' for standard input.\n", stdout);
    return EXIT_OK;
}

/* A usage error: what is wrong (quoting arg when not NULL) and the command's usage line, on
 * stderr; exit status 2. */
static int usage_error(const command *c, const char *what, const char *arg) {
    if (arg)
        fprintf(stderr, "loom-ir: %s: %s '%s'\nusage: loom-ir %s\n", c->name, what, arg, c->usage);
    else
        fprintf(stderr, "loom-ir: %s: %s\nusage: loom-ir %s\n", c->name, what, c->usage);
    return EXIT_USAGE;
}

/* An option parser: 1 when it took argv[*i] (advancing *i past a separate value), 0 when it
 * does not know it, or an exit status + 2 (2: usage error already reported). */
typedef int (*option_fn)(const command *c, int argc, char **argv, int *i, void *ud);

/* Collects a command's n_files FILE operands and, through `option` (may be NULL), its options;
 * "--" ends the options and "-" is a FILE. Returns -1 to go on, else the exit status: 0
 * after --help, 2 on a usage error. */
static int parse_args(const command *c, int argc, char **argv, int n_files, const char **files,
                      option_fn option, void *ud) {
    int got = 0;
    bool options = true;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (options && strcmp(arg, "--") == 0) {
            options = false;
        } else if (options && (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0)) {
            return command_help(c);
        } else if (options && arg[0] == '-' && arg[1] != '\0') {
            int r = option ? option(c, argc, argv, &i, ud) : 0;
            if (r == 0)
                return usage_error(c, "unknown option", arg);
            if (r > 1)
                return r - 2;
        } else if (got == n_files) {
            return usage_error(c, "unexpected argument", arg);
        } else {
            files[got++] = arg;
        }
    }
    if (got < n_files)
        return usage_error(c, n_files - got == 1 ? "missing FILE" : "missing FILEs", NULL);
    return -1;
}

/* The value of option `name` in argv[*i]: "--name=V" or "--name V" (advancing *i). NULL
 * when argv[*i] is another option; *missing is set when the value is absent. */
static const char *option_value(const char *name, int argc, char **argv, int *i, bool *missing) {
    size_t len = strlen(name);
    *missing = false;
    if (strncmp(argv[*i], name, len) != 0)
        return NULL;
    if (argv[*i][len] == '=')
        return argv[*i] + len + 1;
    if (argv[*i][len] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        *missing = true;
        return NULL;
    }
    return argv[++*i];
}

static void write_stdout(const char *chunk, size_t len, void *ud) {
    (void)ud;
    fwrite(chunk, 1, len, stdout);
}

/* The shown name of a path: "<stdin>" for "-". */
static const char *shown_path(const char *path) {
    return strcmp(path, "-") == 0 ? "<stdin>" : path;
}

/* Reads and parses path into g, reporting any error on stderr as a compiler would
 * (FILE:LINE:COL: error: ...). */
static bool load(const char *path, loom_ir_graph *g) {
    loom_allocator a = loom_allocator_system();
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    char *text = NULL;
    size_t len = 0;
    loom_status st = loom_ir_read_file(path, &a, &text, &len, &d);
    if (st == LOOM_OK) {
        st = loom_ir_graph_parse(g, text, len, &d);
        loom_ir_free(&a, text, len + 1);
    }
    if (st == LOOM_OK)
        return true;
    const char *msg = d.msg;
    size_t plen = strlen(path); /* file.c's messages start with "path: " */
    if (strncmp(msg, path, plen) == 0 && strncmp(msg + plen, ": ", 2) == 0)
        msg += plen + 2;
    if (st == LOOM_STATUS_PARSE_ERROR && d.line > 0)
        fprintf(stderr, "%s:%d:%d: error: %s\n", shown_path(path), (int)d.line, (int)d.col, msg);
    else
        fprintf(stderr, "%s: error: %s\n", shown_path(path), msg);
    return false;
}

/* Exit status 1 when stdout could not be written (a full disk, a closed pipe). */
static int finish_output(int rc) {
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "loom-ir: error: cannot write the output\n");
        return rc == EXIT_OK ? EXIT_INVALID : rc;
    }
    return rc;
}

static double numel_f64(const loom_ir_node *n) {
    double v = 1;
    for (int32_t i = 0; i < n->rank; i++)
        v *= (double)n->shape[i];
    return v;
}

static double bytes_f64(const loom_ir_node *n) {
    return numel_f64(n) * (double)loom_dtype_size(n->dtype);
}

static void print_stats(const loom_ir_graph *g) {
    char type[LOOM_IR_TYPE_STR_MAX];
    int32_t per_op[LOOM_IR_OP_COUNT_] = {0};
    double flops = 0, in_bytes = 0, out_bytes = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        per_op[g->nodes[i].op]++;
        flops += loom_ir_node_flops(g, &g->nodes[i]);
    }
    printf("nodes: %d\n", (int)g->n_nodes);
    printf("ops:\n");
    for (int op = 0; op < LOOM_IR_OP_COUNT_; op++)
        if (per_op[op])
            printf("  %-18s %d\n", loom_ir_op_name((loom_ir_op)op), (int)per_op[op]);
    printf("inputs: %d\n", (int)g->n_graph_inputs);
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (n->op != LOOM_IR_OP_INPUT)
            continue;
        in_bytes += bytes_f64(n);
        printf("  input %lld: %%%d %s (%.0f bytes)\n", (long long)n->attrs.index, (int)i,
               loom_ir_format_type(type, sizeof type, n->dtype, n->rank, n->shape),
               bytes_f64(n));
    }
    printf("outputs: %d\n", (int)g->n_outputs);
    for (int32_t o = 0; o < g->n_outputs; o++) {
        const loom_ir_node *n = &g->nodes[g->outputs[o].node];
        out_bytes += bytes_f64(n);
        printf("  output %d: %%%d %s (%.0f bytes)", (int)o, (int)g->outputs[o].node,
               loom_ir_format_type(type, sizeof type, n->dtype, n->rank, n->shape),
               bytes_f64(n));
        if (g->outputs[o].alias >= 0)
            printf(", written into input %d", (int)g->outputs[o].alias);
        printf("\n");
    }
    printf("input bytes: %.0f\n", in_bytes);
    printf("output bytes: %.0f\n", out_bytes);
    printf("flops: %.0f\n", flops);
}

/* `// after cse (changed)` and the graph, after every pass of `opt --print-after-each` */
static void print_after_pass(const char *pass_name, bool changed, const loom_ir_graph *g,
                             void *ud) {
    (void)ud;
    printf("// after %s (%s)\n", pass_name, changed ? "changed" : "unchanged");
    fflush(stdout);
    loom_ir_graph_print(g, write_stdout, NULL);
}

static void print_known_passes(void) {
    int32_t n;
    const loom_pass *const *all = loom_pass_all(&n);
    fprintf(stderr, "known passes:");
    for (int32_t i = 0; i < n; i++)
        fprintf(stderr, "%s %s", i ? "," : "", all[i]->name);
    fprintf(stderr, "\n");
}

/* ---- commands ------------------------------------------------------------------------------ */

/* The commands that load one FILE and show it one way. */
static void show_print(const char *path, const loom_ir_graph *g) {
    (void)path;
    loom_ir_graph_print(g, write_stdout, NULL);
}

static void show_verify(const char *path, const loom_ir_graph *g) {
    printf("%s: ok: %d nodes, %d inputs, %d outputs\n", shown_path(path), (int)g->n_nodes,
           (int)g->n_graph_inputs, (int)g->n_outputs);
}

static void show_stats(const char *path, const loom_ir_graph *g) {
    (void)path;
    print_stats(g);
}

static void show_dot(const char *path, const loom_ir_graph *g) {
    (void)path;
    loom_ir_graph_dot(g, write_stdout, NULL);
}

static void show_hash(const char *path, const loom_ir_graph *g) {
    (void)path;
    printf("%016" PRIx64 "\n", loom_ir_graph_hash(g));
}

static int run_show(const command *c, int argc, char **argv) {
    const char *path;
    int rc = parse_args(c, argc, argv, 1, &path, NULL, NULL);
    if (rc >= 0)
        return rc;
    static const struct {
        const char *name;
        void (*show)(const char *path, const loom_ir_graph *g);
    } shows[] = {{"print", show_print},
                 {"verify", show_verify},
                 {"stats", show_stats},
                 {"dot", show_dot},
                 {"hash", show_hash}};
    loom_allocator a = loom_allocator_system();
    loom_ir_graph g;
    loom_ir_graph_init(&g, &a);
    rc = EXIT_INVALID;
    if (load(path, &g)) {
        for (size_t i = 0; i < sizeof shows / sizeof shows[0]; i++)
            if (strcmp(c->name, shows[i].name) == 0)
                shows[i].show(path, &g);
        rc = finish_output(EXIT_OK);
    }
    loom_ir_graph_deinit(&g);
    return rc;
}

/* loom-ir diff [--max=N] A B */
static int diff_option(const command *c, int argc, char **argv, int *i, void *ud) {
    bool missing;
    const char *v = option_value("--max", argc, argv, i, &missing);
    if (missing)
        return usage_error(c, "missing value for", argv[*i]) + 2;
    if (!v)
        return 0;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno || n < 0 || n > INT32_MAX)
        return usage_error(c, "--max needs a count, not", v) + 2;
    *(int32_t *)ud = (int32_t)n;
    return 1;
}

static int run_diff(const command *c, int argc, char **argv) {
    const char *paths[2];
    int32_t max_items = -1;
    int rc = parse_args(c, argc, argv, 2, paths, diff_option, &max_items);
    if (rc >= 0)
        return rc;
    if (strcmp(paths[0], "-") == 0 && strcmp(paths[1], "-") == 0)
        return usage_error(c, "only one FILE may be '-'", NULL);
    loom_allocator a = loom_allocator_system();
    loom_ir_graph g[2];
    loom_ir_graph_init(&g[0], &a);
    loom_ir_graph_init(&g[1], &a);
    rc = EXIT_USAGE; /* as diff(1): trouble is 2, so that 1 means "they differ" */
    if (load(paths[0], &g[0]) && load(paths[1], &g[1])) {
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        int32_t n = 0;
        if (loom_ir_graph_diff(&g[0], &g[1], max_items, write_stdout, NULL, &n, &d) != LOOM_OK)
            fprintf(stderr, "loom-ir: diff: error: %s\n", d.msg);
        else if (finish_output(EXIT_OK) == EXIT_OK)
            rc = n == 0 ? EXIT_OK : EXIT_INVALID;
    }
    loom_ir_graph_deinit(&g[0]);
    loom_ir_graph_deinit(&g[1]);
    return rc;
}

/* loom-ir opt --passes=LIST [--print-after-each] FILE */
typedef struct opt_args {
    const char *list;
    bool each;
} opt_args;

static int opt_option(const command *c, int argc, char **argv, int *i, void *ud) {
    opt_args *o = ud;
    bool missing;
    const char *v = option_value("--passes", argc, argv, i, &missing);
    if (missing)
        return usage_error(c, "missing value for", argv[*i]) + 2;
    if (v) {
        o->list = v;
        return 1;
    }
    if (strcmp(argv[*i], "--print-after-each") != 0)
        return 0;
    o->each = true;
    return 1;
}

static int run_opt(const command *c, int argc, char **argv) {
    const char *path;
    opt_args o = {0};
    int rc = parse_args(c, argc, argv, 1, &path, opt_option, &o);
    if (rc >= 0)
        return rc;
    if (!o.list)
        return usage_error(c, "missing --passes=LIST", NULL);
    enum { MAX_PASSES = 64 };
    const loom_pass *passes[MAX_PASSES];
    int32_t n_passes = 0;
    for (const char *p = o.list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char name[64];
        const loom_pass *pass = NULL;
        if (len > 0 && len < sizeof name) {
            memcpy(name, p, len);
            name[len] = '\0';
            pass = loom_pass_find(name);
        }
        if (!pass) {
            fprintf(stderr, "loom-ir: opt: unknown pass '%.*s'; ", (int)len, p);
            print_known_passes();
            return EXIT_USAGE;
        }
        if (n_passes == MAX_PASSES) {
            fprintf(stderr, "loom-ir: opt: more than %d passes\n", MAX_PASSES);
            return EXIT_USAGE;
        }
        passes[n_passes++] = pass;
        p = end ? end + 1 : p + len;
    }

    loom_allocator a = loom_allocator_system();
    loom_ir_graph g;
    loom_ir_graph_init(&g, &a);
    rc = EXIT_INVALID;
    if (load(path, &g)) {
        loom_pass_options opts = {.verify_each = true,
                                  .after_pass = o.each ? print_after_pass : NULL};
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        if (loom_pass_run_pipeline(&g, passes, n_passes, &opts, &d) != LOOM_OK) {
            fprintf(stderr, "%s: error: %s\n", shown_path(path), d.msg);
        } else {
            if (!o.each)
                loom_ir_graph_print(&g, write_stdout, NULL);
            rc = finish_output(EXIT_OK);
        }
    }
    loom_ir_graph_deinit(&g);
    return rc;
}

/* plan's options: --svg */
static int plan_option(const command *c, int argc, char **argv, int *i, void *ud) {
    (void)c;
    (void)argc;
    if (strcmp(argv[*i], "--svg") != 0)
        return 0;
    *(bool *)ud = true;
    return 1;
}

/* loom-ir plan [--svg] FILE */
static int run_plan(const command *c, int argc, char **argv) {
    const char *path;
    bool svg = false;
    int rc = parse_args(c, argc, argv, 1, &path, plan_option, &svg);
    if (rc >= 0)
        return rc;
    loom_allocator a = loom_allocator_system();
    loom_ir_graph g;
    loom_ir_graph_init(&g, &a);
    loom_ir_plan plan;
    loom_ir_plan_init(&plan, &a);
    rc = EXIT_INVALID;
    if (load(path, &g)) {
        loom_pass_options opts = {.verify_each = true};
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        loom_ir_memory_report mem;
        if (loom_pass_build_plan(&g, &opts, &plan, &d) != LOOM_OK) {
            fprintf(stderr, "%s: error: %s\n", shown_path(path), d.msg);
        } else if (!svg) {
            loom_ir_plan_print(&plan, &g, write_stdout, NULL);
            rc = finish_output(EXIT_OK);
        } else if (loom_ir_plan_memory(&plan, &g, &mem) != LOOM_OK) {
            fprintf(stderr, "%s: error: out of memory\n", shown_path(path));
        } else {
            loom_ir_memory_report_svg(&mem, &plan, &g, write_stdout, NULL);
            loom_ir_memory_report_deinit(&mem);
            rc = finish_output(EXIT_OK);
        }
    }
    loom_ir_plan_deinit(&plan);
    loom_ir_graph_deinit(&g);
    return rc;
}

/* compile's options: --emit=WHAT */
static int compile_option(const command *c, int argc, char **argv, int *i, void *ud) {
    bool missing;
    const char *v = option_value("--emit", argc, argv, i, &missing);
    if (missing)
        return usage_error(c, "missing value for", "--emit") + 2;
    if (!v)
        return 0;
    *(const char **)ud = v;
    return 1;
}

/* Loads path and runs compile (emit set) or run (ro set) on it; the exit status. */
typedef struct run_opts run_opts;
static int on_graph(const char *path, const char *emit, const run_opts *ro);

/* loom-ir compile [--emit=WHAT] FILE */
static int run_compile(const command *c, int argc, char **argv) {
    const char *path, *emit = "asm";
    int rc = parse_args(c, argc, argv, 1, &path, compile_option, &emit);
    return rc >= 0 ? rc : on_graph(path, emit, NULL);
}

struct run_opts {
    int repeat;
    bool check;
    uint64_t seed;
};

static int on_graph(const char *path, const char *emit, const run_opts *ro) {
    loom_allocator a = loom_allocator_system();
    loom_ir_graph g;
    loom_ir_graph_init(&g, &a);
    int rc = EXIT_INVALID;
    if (load(path, &g))
        rc = finish_output(
            emit ? loom_ir_cmd_compile(&g, shown_path(path), emit)
                 : loom_ir_cmd_run(&g, shown_path(path), ro->repeat, ro->check, ro->seed));
    loom_ir_graph_deinit(&g);
    return rc;
}

/* run's options: --repeat=N, --check, --seed=S */
static int run_option(const command *c, int argc, char **argv, int *i, void *ud) {
    run_opts *o = ud;
    if (strcmp(argv[*i], "--check") == 0) {
        o->check = true;
        return 1;
    }
    static const char *const names[2] = {"--repeat", "--seed"};
    for (int k = 0; k < 2; k++) {
        bool missing;
        const char *v = option_value(names[k], argc, argv, i, &missing);
        if (missing)
            return usage_error(c, "missing value for", names[k]) + 2;
        if (!v)
            continue;
        char *end = NULL;
        long long n = strtoll(v, &end, 10);
        if (!*v || *end || n < (k == 0 ? 1 : 0) || (k == 0 && n > 1000000))
            return usage_error(c,
                               k == 0 ? "--repeat wants a count from 1 to 1000000, not"
                                      : "--seed wants a number >= 0, not",
                               v) +
                   2;
        if (k == 0)
            o->repeat = (int)n;
        else
            o->seed = (uint64_t)n;
        return 1;
    }
    return 0;
}

/* loom-ir run [--repeat=N] [--check] [--seed=S] FILE */
static int run_run(const command *c, int argc, char **argv) {
    const char *path;
    run_opts o = {.repeat = 10, .seed = 1};
    int rc = parse_args(c, argc, argv, 1, &path, run_option, &o);
    return rc >= 0 ? rc : on_graph(path, NULL, &o);
}

typedef struct ops_opts {
    const char *op;
    bool check, json;
} ops_opts;

/* ops' options: --op=NAME, --check, --json */
static int ops_option(const command *c, int argc, char **argv, int *i, void *ud) {
    ops_opts *o = ud;
    if (strcmp(argv[*i], "--check") == 0 || strcmp(argv[*i], "--json") == 0) {
        *(argv[*i][2] == 'c' ? &o->check : &o->json) = true;
        return 1;
    }
    bool missing;
    const char *v = option_value("--op", argc, argv, i, &missing);
    if (missing)
        return usage_error(c, "missing value for", "--op") + 2;
    if (!v)
        return 0;
    o->op = v;
    return 1;
}

/* loom-ir ops [--op=NAME] [--check] [--json] */
static int run_ops(const command *c, int argc, char **argv) {
    ops_opts o = {0};
    int rc = parse_args(c, argc, argv, 0, NULL, ops_option, &o);
    if (rc >= 0)
        return rc;
    if (o.op && loom_ir_op_from_name(o.op, strlen(o.op)) == LOOM_IR_OP_COUNT_)
        return usage_error(c, "no such op in ops.def:", o.op);
    return finish_output(loom_ir_cmd_ops(o.op, o.check, o.json));
}

/* loom-ir compare [--rules=R] [--json] [--html=FILE] A B */
typedef struct compare_opts {
    loom_ir_compare_rules rules;
    bool json;
    const char *html;
} compare_opts;

static int compare_option(const command *c, int argc, char **argv, int *i, void *ud) {
    compare_opts *o = ud;
    if (strcmp(argv[*i], "--json") == 0) {
        o->json = true;
        return 1;
    }
    bool missing;
    const char *v = option_value("--rules", argc, argv, i, &missing);
    if (missing)
        return usage_error(c, "missing value for", "--rules") + 2;
    if (v) {
        char err[160];
        if (!loom_ir_compare_rules_parse(v, &o->rules, err, sizeof err))
            return usage_error(c, "--rules:", err) + 2;
        return 1;
    }
    v = option_value("--html", argc, argv, i, &missing);
    if (missing)
        return usage_error(c, "missing value for", "--html") + 2;
    if (!v)
        return 0;
    o->html = v;
    return 1;
}

static int run_compare(const command *c, int argc, char **argv) {
    compare_opts o = {.rules = LOOM_IR_COMPARE_RULES_DEFAULT};
    const char *paths[2];
    int rc = parse_args(c, argc, argv, 2, paths, compare_option, &o);
    if (rc >= 0)
        return rc;
    return finish_output(loom_ir_cmd_compare(paths[0], paths[1], &o.rules, o.json, o.html));
}

static const command commands[] = {
    {"print", "print FILE", "parse, verify and print FILE in canonical form",
     "Parses and verifies FILE, then prints it in canonical form.\n", run_show},
    {"verify", "verify FILE", "parse and verify FILE; errors as FILE:LINE:COL",
     "Parses and verifies FILE; errors are reported as FILE:LINE:COL: error: MESSAGE.\n", run_show},
    {"stats", "stats FILE", "node count, ops, inputs, outputs, bytes, estimated FLOPs",
     "Node count, ops, graph inputs and outputs, bytes and estimated FLOPs of FILE.\n", run_show},
    {"dot", "dot FILE", "the graph in Graphviz DOT",
     "The graph in Graphviz DOT (pipe into `dot -Tsvg`).\n", run_show},
    {"hash", "hash FILE", "the structural hash the executable cache keys on",
     "The structural hash the executable cache keys on.\n", run_show},
    {"diff", "diff [--max=N] A B", "what differs between graphs A and B, node by node",
     "Compares graph A (the earlier) with B node by node, matching nodes by structure\n"
     "rather than id, and prints each difference with its source location: changed\n"
     "types, attributes and constants, new and removed nodes, changed outputs. Node ids\n"
     "are B's except for removed nodes. Type changes that follow from earlier ones come\n"
     "last.\n"
     "  --max=N   print at most N differences, then how many more there are\n"
     "A or B (not both) may be '-' for standard input.\n"
     "Exit status: 0 when the graphs are equal, 1 when they differ, 2 on usage errors\n"
     "and when a file is unreadable or invalid.\n",
     run_diff},
    {"opt", "opt --passes=P1,P2,... [--print-after-each] FILE",
     "run passes in order and print the result",
     "Runs the passes in order (verifying after each) and prints the result.\n"
     "  --passes=LIST        the passes, comma-separated\n"
     "  --print-after-each   print the graph after every pass instead\n",
     run_opt},
    {"plan", "plan [--svg] FILE",
     "the JIT pipeline's execution plan: kernels, buffers, peak memory",
     "Runs the JIT pipeline (dce, cse, fold, fusion, memory planning) and prints the\n"
     "execution plan: the planned peak and what is alive there, largest first, then the\n"
     "kernels, buffers and copies. --svg: instead, an SVG picture of the live bytes over\n"
     "the kernel schedule with the peak marked.\n",
     run_plan},
    {"compile", "compile [--emit=mlir|lowered|llvm|asm|plan|summary] FILE",
     "compile FILE as a step would and print its MLIR, LLVM IR, assembly, plan or summary",
     "Runs the JIT pipeline on FILE (passes, plan, codegen: the same as a step) and prints\n"
     "what --emit names: mlir (the kernels' MLIR), lowered (after lowering to the LLVM\n"
     "dialect), llvm (LLVM IR, one module after another), asm (the default: assembly for\n"
     "this CPU), plan (the execution plan) or summary (kernels, FLOPs, bytes, peak, compile\n"
     "time, what each pass changed).\n",
     run_compile},
    {"run", "run [--repeat=N] [--check] [--seed=S] FILE",
     "compile FILE, run it on random inputs and time it; --check against the interpreter",
     "Compiles FILE as a step would, runs it N times (default 10) on random inputs from\n"
     "seed S (default 1: floats in [-1, 1), integers in [-8, 8), random bools) and prints\n"
     "the median, min and max run time, the compile time and the kernels by total time.\n"
     "Each run is as a step's: an output that aliases an input is written into that\n"
     "input's buffer, so the next run starts from it. --check compares every run's\n"
     "outputs with the reference interpreter's from the same inputs (exit 1 when an\n"
     "element differs by more than rtol x (|value| + the output's RMS); rtol is 1e-4 for\n"
     "f32, 2e-2 for bf16 and f16, 1e-9 for f64). With LOOM_PERF_MAP=1 the kernels\n"
     "go into /tmp/perf-<pid>.map, so `perf record` of the run names them; with\n"
     "LOOM_PERF_MAP=jitdump their code goes into /tmp/jit-<pid>.dump as well, for\n"
     "`perf inject --jit` and `perf annotate` (README.md, LOOM_PERF_MAP).\n",
     run_run},
    {"ops", "ops [--op=NAME] [--check] [--json]",
     "every op of ops.def and what exists for it in each layer",
     "Lists every op of ops.def (--op: only NAME) with its kind, autocast class and the\n"
     "dtypes it takes, and what each layer does with it, found by asking the layers on\n"
     "random one-op samples (3 per dtype): the dtypes the reference interpreter runs, the\n"
     "dtypes codegen lowers, whether autograd has a VJP, and how 16-bit data is computed\n"
     "(the 16-bit matmul paths of this CPU). Anything short of all is footnoted with the\n"
     "layer's own message.\n"
     "  --check   compile and run every sample and compare it with the interpreter\n"
     "            (slower: progress on stderr; exit 1 when one differs)\n"
     "  --json    one JSON object instead of the table\n",
     run_ops},
    {"compare", "compare [--rules=R] [--json] [--html=FILE] A B",
     "two tensor dumps (LOOM_DUMP_TENSORS) tensor by tensor, with msProbe's pass rules",
     "Compares the tensors of A and B (safetensors files: LOOM_DUMP_TENSORS's, or any with\n"
     "the same names), matched by name, in A's order (a dump's: the graph's), and prints per\n"
     "tensor the cosine similarity, the max absolute and relative errors (relative to A),\n"
     "the RMSE, the element count and both dtypes, marking the first failing tensor. A\n"
     "tensor fails, by msProbe's rules, when cosine < 0.99 and max abs > 0.001, or cosine\n"
     "< 0.9, or max abs > 1; when it is in one file only or the shapes differ; or when its\n"
     "values are inf or NaN where the other file's are not.\n"
     "  --rules=R     change the thresholds: cos=0.99,abs=0.001,cos_fail=0.9,abs_fail=1\n"
     "  --json        one JSON object instead of the table\n"
     "  --html=FILE   also write FILE, a self-contained page with the table (sortable,\n"
     "                failing rows highlighted)\n"
     "Exit status: 0 when every tensor passes, 1 when one fails, 2 on usage errors and\n"
     "when a file is unreadable or invalid.\n",
     run_compare},
};

static void print_usage(FILE *f) {
    fputs("usage: loom-ir COMMAND [OPTIONS] FILE...\n\nCommands:\n", f);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %s\n      %s\n", commands[i].usage, commands[i].summary);
    fputs("\n`loom-ir COMMAND --help` describes a command. FILE may be '-' for standard input.\n"
          "Exit status: 0 on success, 1 when FILE is invalid or unreadable (diff: when the\n"
          "graphs differ), 2 on usage errors.\n",
          f);
}

static const command *find_command(const char *name) {
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(name, commands[i].name) == 0)
            return &commands[i];
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs("loom-ir: missing COMMAND\nusage: loom-ir COMMAND [OPTIONS] FILE... "
              "(loom-ir --help lists the commands)\n",
              stderr);
        return EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        if (argc > 2 && strcmp(name, "help") == 0) { /* help COMMAND */
            const command *c = find_command(argv[2]);
            if (c)
                return command_help(c);
            fprintf(stderr, "loom-ir: help: unknown command '%s'\n", argv[2]);
            return EXIT_USAGE;
        }
        print_usage(stdout);
        return EXIT_OK;
    }
    const command *c = find_command(name);
    if (!c) {
        fprintf(stderr,
                "loom-ir: unknown command '%s'\nusage: loom-ir COMMAND [OPTIONS] "
                "FILE... (loom-ir --help lists the commands)\n",
                name);
        return EXIT_USAGE;
    }
    return c->run(c, argc - 2, argv + 2);
}
