/* GPT-2's model for examples/gpt2: host weights (random init, nanoGPT/HF safetensors, llm.c's
 * .bin), their upload as Loom parameters, and the forward pass (see gpt2_model.h). */
#include "gpt2_model.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train_util.h"

/* The slots of a block, in nanoGPT's state_dict order. */
static const char *const layer_names[GPT2_PER_LAYER] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
enum {
    S_LN1_W,
    S_LN1_B,
    S_ATTN_W,
    S_ATTN_B,
    S_APROJ_W,
    S_APROJ_B,
    S_LN2_W,
    S_LN2_B,
    S_FC_W,
    S_FC_B,
    S_MPROJ_W,
    S_MPROJ_B
};

static int32_t slot(int64_t layer, int s) {
    return (int32_t)(2 + layer * GPT2_PER_LAYER + s);
}

static int64_t numel(const gpt2_weights *w, int32_t i) {
    return w->rank[i] == 1 ? w->shape[i][0] : w->shape[i][0] * w->shape[i][1];
}

void gpt2_weights_free(gpt2_weights *w) {
    for (int32_t i = 0; w->data && i < w->n; i++)
        free(w->data[i]);
    free(w->data);
    free(w->names);
    free(w->rank);
    free(w->shape);
    *w = (gpt2_weights){0};
}

static void set(gpt2_weights *w, int32_t i, const char *name, int32_t rank, int64_t d0,
                int64_t d1) {
    snprintf(w->names[i], sizeof *w->names, "%s", name);
    w->rank[i] = rank;
    w->shape[i][0] = d0;
    w->shape[i][1] = rank == 2 ? d1 : 1;
}

int gpt2_weights_alloc(gpt2_weights *w, const gpt2_config *cfg) {
    int64_t L = cfg->n_layer, C = cfg->n_embd;
    *w = (gpt2_weights){.cfg = *cfg, .n = (int32_t)(GPT2_OUTER + GPT2_PER_LAYER * L)};
    w->names = calloc((size_t)w->n, sizeof *w->names);
    w->rank = calloc((size_t)w->n, sizeof *w->rank);
    w->shape = calloc((size_t)w->n, sizeof *w->shape);
    w->data = calloc((size_t)w->n, sizeof *w->data);
    if (!w->names || !w->rank || !w->shape || !w->data)
        goto oom;
    set(w, 0, "transformer.wte.weight", 2, cfg->vocab_size, C);
    set(w, 1, "transformer.wpe.weight", 2, cfg->block_size, C);
    const int64_t out[GPT2_PER_LAYER] = {C, C, 3 * C, 3 * C, C, C, C, C, 4 * C, 4 * C, C, C};
    const int64_t in[GPT2_PER_LAYER] = {0, 0, C, 0, C, 0, 0, 0, C, 0, 4 * C, 0};
    for (int64_t l = 0; l < L; l++)
        for (int s = 0; s < GPT2_PER_LAYER; s++) {
            char name[64];
            snprintf(name, sizeof name, "transformer.h.%" PRId64 ".%s", l, layer_names[s]);
            set(w, slot(l, s), name, in[s] ? 2 : 1, out[s], in[s]);
        }
    set(w, w->n - 2, "transformer.ln_f.weight", 1, C, 0);
    set(w, w->n - 1, "transformer.ln_f.bias", 1, C, 0);
    for (int32_t i = 0; i < w->n; i++)
        if (!(w->data[i] = malloc((size_t)numel(w, i) * sizeof(float))))
            goto oom;
    return 0;
oom:
    fprintf(stderr, "%sout of memory for the weights\n", ex_who());
    gpt2_weights_free(w);
    return 1;
}

void gpt2_weights_init_random(gpt2_weights *w, uint64_t seed) {
    loom_rng rng;
    loom_rng_init(&rng, seed);
    double proj_std = 0.02 / sqrt(2.0 * (double)w->cfg.n_layer);
    for (int32_t i = 0; i < w->n; i++) {
        const char *name = w->names[i];
        size_t len = strlen(name);
        bool ln = strstr(name, "ln_") != NULL;
        bool bias = len > 5 && !strcmp(name + len - 5, ".bias");
        bool proj = strstr(name, "c_proj.weight") != NULL;
        for (int64_t k = 0; k < numel(w, i); k++)
            w->data[i][k] = ln     ? (bias ? 0.0f : 1.0f)
                            : bias ? 0.0f
                                   : (float)(loom_rng_normal(&rng) * (proj ? proj_std : 0.02));
    }
}

/* ---- safetensors ----------------------------------------------------------------------- */

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f)
        bits = sign | 0x7f800000u | (man << 13);
    else if (exp == 0) {
        float v = ldexpf((float)man, -24);
        return sign ? -v : v;
    } else
        bits = sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Element k of a file tensor as f32 (its data may be unaligned). */
static float file_elem(const void *data, loom_dtype dt, int64_t k) {
    const unsigned char *p = data;
    if (dt == LOOM_DTYPE_F32) {
        float f;
        memcpy(&f, p + 4 * k, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * k, 2);
    if (dt == LOOM_DTYPE_F16)
        return half_to_float(h);
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static void shape_text(char *buf, size_t size, int32_t rank, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, size, "[");
    for (int32_t i = 0; i < rank && o < size; i++)
        o += (size_t)snprintf(buf + o, size - o, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (o < size)
        snprintf(buf + o, size - o, "]");
}

typedef struct st_file {
    loom_safetensors *f;
    const char *path, *prefix;
} st_file;

/* The file's tensor named prefix + name (the model's name without "transformer."), or -1. */
static int32_t st_find(const st_file *sf, const char *name) {
    char full[96];
    snprintf(full, sizeof full, "%s%s", sf->prefix, name);
    return loom_safetensors_find(sf->f, full);
}

static const char *strip(const char *model_name) {
    return !strncmp(model_name, "transformer.", 12) ? model_name + 12 : model_name;
}

/* Whether the file's name (prefix stripped) is one a loader may ignore: HF's attention
 * buffers (attn.bias, attn.masked_bias: the causal mask), nanoGPT's attn.bias (its mask when
 * flash attention is off) and the tied lm_head.weight. */
static bool ignorable(const char *rest) {
    size_t len = strlen(rest);
    return !strcmp(rest, "lm_head.weight") ||
           (len > 10 && !strcmp(rest + len - 10, ".attn.bias")) ||
           (len > 17 && !strcmp(rest + len - 17, ".attn.masked_bias"));
}

/* The size a field of cfg takes from the file: given (non-zero) must equal it. */
static int take(int64_t *field, int64_t file_value, const char *flag, const char *path,
                const char *tensor) {
    if (*field && *field != file_value) {
        fprintf(stderr, "%s--init %s: %s is %" PRId64 " in the file ('%s'), %" PRId64 " given\n",
                ex_who(), path, flag, file_value, tensor, *field);
        return 1;
    }
    *field = file_value;
    return 0;
}

int gpt2_weights_load_safetensors(gpt2_weights *w, gpt2_config *cfg, const char *path,
                                  gpt2_layout layout) {
    char err[512];
    st_file sf = {.path = path};
    *w = (gpt2_weights){0};
    if (loom_safetensors_open(path, &sf.f, err, sizeof err) != LOOM_OK) {
        fprintf(stderr, "%s--init: %s\n", ex_who(), err);
        return 1;
    }
    int rc = 1;
    sf.prefix = loom_safetensors_find(sf.f, "transformer.wte.weight") >= 0 ? "transformer." : "";
    int32_t wte = st_find(&sf, "wte.weight"), wpe = st_find(&sf, "wpe.weight");
    int32_t attn = st_find(&sf, "h.0.attn.c_attn.weight");
    if (wte < 0 || wpe < 0 || attn < 0) {
        fprintf(stderr,
                "%s--init %s: not a GPT-2 checkpoint: it lacks '%swte.weight', '%swpe.weight' or "
                "'%sh.0.attn.c_attn.weight' (nanoGPT's names start with 'transformer.', Hugging "
                "Face's have no prefix)\n",
                ex_who(), path, sf.prefix, sf.prefix, sf.prefix);
        goto out;
    }
    int32_t r_wte, r_wpe, r_attn;
    int64_t s_wte[LOOM_MAX_RANK], s_wpe[LOOM_MAX_RANK], s_attn[LOOM_MAX_RANK];
    loom_safetensors_tensor(sf.f, wte, NULL, NULL, &r_wte, s_wte, NULL, NULL);
    loom_safetensors_tensor(sf.f, wpe, NULL, NULL, &r_wpe, s_wpe, NULL, NULL);
    loom_safetensors_tensor(sf.f, attn, NULL, NULL, &r_attn, s_attn, NULL, NULL);
    if (r_wte != 2 || r_wpe != 2 || r_attn != 2) {
        fprintf(stderr, "%s--init %s: wte, wpe and h.0.attn.c_attn.weight must be 2-D\n", ex_who(),
                path);
        goto out;
    }
    int64_t C = s_wte[1];
    bool conv1d;
    if (layout == GPT2_LAYOUT_AUTO) {
        if (s_attn[0] == 3 * C && s_attn[1] == C)
            conv1d = false;
        else if (s_attn[0] == C && s_attn[1] == 3 * C)
            conv1d = true;
        else {
            char sh[64];
            shape_text(sh, sizeof sh, 2, s_attn);
            fprintf(stderr,
                    "%s--init %s: '%sh.0.attn.c_attn.weight' is %s: neither nanoGPT's [3C, C] nor "
                    "Hugging Face's [C, 3C] for n_embd %" PRId64 "\n",
                    ex_who(), path, sf.prefix, sh, C);
            goto out;
        }
    } else
        conv1d = layout == GPT2_LAYOUT_HF;
    int64_t L = 0;
    char name[96];
    for (;; L++) {
        snprintf(name, sizeof name, "h.%" PRId64 ".ln_1.weight", L);
        if (st_find(&sf, name) < 0)
            break;
    }
    if (take(&cfg->n_embd, C, "--n-embd", path, "wte.weight") ||
        take(&cfg->vocab_size, s_wte[0], "--vocab-size", path, "wte.weight") ||
        take(&cfg->block_size, s_wpe[0], "--block-size", path, "wpe.weight") ||
        take(&cfg->n_layer, L, "--n-layer", path, "h.N.ln_1.weight"))
        goto out;
    if (!cfg->n_head) {
        if (C % 64) {
            fprintf(stderr,
                    "%s--init %s: the file does not say n_head and n_embd %" PRId64
                    " is not a multiple of GPT-2's head size 64: give --n-head\n",
                    ex_who(), path, C);
            goto out;
        }
        cfg->n_head = C / 64;
    }
    if (cfg->n_embd % cfg->n_head) {
        fprintf(stderr, "%s--init %s: --n-head %" PRId64 " does not divide n_embd %" PRId64 "\n",
                ex_who(), path, cfg->n_head, cfg->n_embd);
        goto out;
    }
    if (gpt2_weights_alloc(w, cfg))
        goto out;
    for (int32_t i = 0; i < w->n; i++) {
        const char *rest = strip(w->names[i]);
        int32_t k = st_find(&sf, rest);
        if (k < 0) {
            fprintf(stderr, "%s--init %s: tensor '%s%s' is missing\n", ex_who(), path, sf.prefix,
                    rest);
            goto out;
        }
        loom_dtype dt;
        int32_t rank;
        int64_t shape[LOOM_MAX_RANK];
        const void *data;
        loom_safetensors_tensor(sf.f, k, NULL, &dt, &rank, shape, &data, NULL);
        /* HF's Conv1D weights are [in, out]: the model's [out, in] transposed. */
        bool transpose = conv1d && w->rank[i] == 2 && i >= 2;
        int64_t want[2] = {w->shape[i][transpose], w->shape[i][!transpose]};
        if (rank != w->rank[i] || shape[0] != want[0] || (rank == 2 && shape[1] != want[1])) {
            char a[64], b[64];
            shape_text(a, sizeof a, rank, shape);
            shape_text(b, sizeof b, w->rank[i], want);
            fprintf(stderr, "%s--init %s: tensor '%s%s' has shape %s, the model needs %s%s\n",
                    ex_who(), path, sf.prefix, rest, a, b,
                    transpose ? " (Hugging Face Conv1D: [in, out])" : "");
            goto out;
        }
        if (dt != LOOM_DTYPE_F32 && dt != LOOM_DTYPE_F16 && dt != LOOM_DTYPE_BF16) {
            fprintf(stderr, "%s--init %s: tensor '%s%s' is %s, not f32, f16 or bf16\n", ex_who(),
                    path, sf.prefix, rest, loom_dtype_name(dt));
            goto out;
        }
        float *dst = w->data[i];
        if (transpose) {
            int64_t out = w->shape[i][0], in = w->shape[i][1];
            for (int64_t r = 0; r < in; r++)
                for (int64_t c = 0; c < out; c++)
                    dst[c * in + r] = file_elem(data, dt, r * out + c);
        } else
            for (int64_t e = 0; e < numel(w, i); e++)
                dst[e] = file_elem(data, dt, e);
    }
    /* Everything else must be a buffer to ignore: a file for another model is an error. */
    for (int32_t k = 0; k < loom_safetensors_count(sf.f); k++) {
        const char *fname = NULL;
        loom_safetensors_tensor(sf.f, k, &fname, NULL, NULL, NULL, NULL, NULL);
        size_t plen = strlen(sf.prefix);
        bool has_prefix = !strncmp(fname, sf.prefix, plen);
        const char *rest = has_prefix ? fname + plen : fname;
        bool known = false;
        for (int32_t i = 0; has_prefix && i < w->n && !known; i++)
            known = !strcmp(strip(w->names[i]), rest);
        if (!known && !ignorable(rest) && !ignorable(fname)) {
            fprintf(stderr,
                    "%s--init %s: unexpected tensor '%s' (a GPT-2 checkpoint of %" PRId64
                    " layers has only the transformer's weights, lm_head.weight and attention "
                    "buffers)\n",
                    ex_who(), path, fname, cfg->n_layer);
            goto out;
        }
    }
    rc = 0;
out:
    if (rc)
        gpt2_weights_free(w);
    loom_safetensors_close(sf.f);
    return rc;
}

/* ---- llm.c ----------------------------------------------------------------------------- */

int gpt2_weights_load_llmc(gpt2_weights *w, gpt2_config *cfg, const char *path) {
    *w = (gpt2_weights){0};
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "%s--init-llmc %s: %s\n", ex_who(), path, strerror(errno));
        return 1;
    }
    int rc = 1;
    int32_t h[256];
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0 || fread(h, sizeof h, 1, fp) != 1) {
        fprintf(stderr, "%s--init-llmc %s: shorter than llm.c's 1024-byte header\n", ex_who(),
                path);
        goto out;
    }
    if (h[0] != 20240326) {
        fprintf(stderr,
                "%s--init-llmc %s: bad magic %d (llm.c's model files start with 20240326)\n",
                ex_who(), path, (int)h[0]);
        goto out;
    }
    if (h[1] != 3) {
        fprintf(stderr,
                "%s--init-llmc %s: version %d: only version 3 (f32 weights, gpt2_124M.bin) is "
                "read%s\n",
                ex_who(), path, (int)h[1],
                h[1] == 5 ? "; version 5 is bf16 (gpt2_124M_bf16.bin)" : "");
        goto out;
    }
    int64_t maxT = h[2], V = h[3], L = h[4], NH = h[5], C = h[6], Vp = h[7];
    if (maxT < 1 || V < 1 || L < 1 || NH < 1 || C < 1 || Vp < V || C % NH || maxT > (1 << 20) ||
        Vp > (1 << 24) || L > 1024 || C > (1 << 16)) {
        fprintf(stderr,
                "%s--init-llmc %s: implausible header: max_seq_len %" PRId64 " vocab %" PRId64
                " layers %" PRId64 " heads %" PRId64 " channels %" PRId64 " padded vocab %" PRId64
                "\n",
                ex_who(), path, maxT, V, L, NH, C, Vp);
        goto out;
    }
    if (take(&cfg->n_embd, C, "--n-embd", path, "header[6]") ||
        take(&cfg->vocab_size, V, "--vocab-size", path, "header[3]") ||
        take(&cfg->block_size, maxT, "--block-size", path, "header[2]") ||
        take(&cfg->n_layer, L, "--n-layer", path, "header[4]") ||
        take(&cfg->n_head, NH, "--n-head", path, "header[5]"))
        goto out;
    int64_t total = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C;
    int64_t need = 1024 + 4 * total;
    if ((int64_t)sb.st_size < need) {
        fprintf(stderr,
                "%s--init-llmc %s: truncated: %lld bytes, the header's sizes need %" PRId64 "\n",
                ex_who(), path, (long long)sb.st_size, need);
        goto out;
    }
    if (gpt2_weights_alloc(w, cfg))
        goto out;
    /* llm.c's order: each kind of tensor for all layers together ([L, ...]). */
    bool ok = fread(w->data[0], sizeof(float), (size_t)(V * C), fp) == (size_t)(V * C) &&
              fseek(fp, (long)((Vp - V) * C * 4), SEEK_CUR) == 0 && /* padded rows */
              fread(w->data[1], sizeof(float), (size_t)(maxT * C), fp) == (size_t)(maxT * C);
    static const int kinds[] = {S_LN1_W, S_LN1_B, S_ATTN_W, S_ATTN_B, S_APROJ_W, S_APROJ_B,
                                S_LN2_W, S_LN2_B, S_FC_W,   S_FC_B,   S_MPROJ_W, S_MPROJ_B};
    for (size_t k = 0; ok && k < sizeof kinds / sizeof *kinds; k++)
        for (int64_t l = 0; ok && l < L; l++) {
            int32_t i = slot(l, kinds[k]);
            size_t n = (size_t)numel(w, i);
            ok = fread(w->data[i], sizeof(float), n, fp) == n;
        }
    for (int32_t i = w->n - 2; ok && i < w->n; i++)
        ok = fread(w->data[i], sizeof(float), (size_t)C, fp) == (size_t)C;
    if (!ok) {
        fprintf(stderr, "%s--init-llmc %s: read error\n", ex_who(), path);
        goto out;
    }
    rc = 0;
out:
    if (rc)
        gpt2_weights_free(w);
    fclose(fp);
    return rc;
}

/* ---- the model ------------------------------------------------------------------------- */

void gpt2_deinit(gpt2 *m) {
    for (int32_t i = 0; m->params && i < m->n_params; i++)
        loom_tensor_release(m->params[i]);
    free(m->params);
    free(m->named);
    free(m->names);
    *m = (gpt2){0};
}

loom_status gpt2_init(loom_context *ctx, gpt2 *m, const gpt2_weights *w) {
    *m = (gpt2){.cfg = w->cfg, .n_params = w->n};
    m->params = calloc((size_t)w->n, sizeof *m->params);
    m->named = calloc((size_t)w->n, sizeof *m->named);
    m->names = calloc((size_t)w->n, sizeof *m->names);
    if (!m->params || !m->named || !m->names) {
        gpt2_deinit(m);
        return LOOM_STATUS_OUT_OF_MEMORY;
    }
    for (int32_t i = 0; i < w->n; i++) {
        memcpy(m->names[i], w->names[i], sizeof *m->names);
        m->params[i] =
            loom_tensor_from_host(ctx, LOOM_DTYPE_F32, w->rank[i], w->shape[i], w->data[i]);
        m->named[i] = (loom_named_tensor){m->names[i], m->params[i]};
        if (!m->params[i]) {
            loom_status st = loom_context_error(ctx);
            gpt2_deinit(m);
            return st;
        }
    }
    return LOOM_OK;
}

int64_t gpt2_num_params(const gpt2_config *c, bool non_embedding) {
    int64_t C = c->n_embd;
    int64_t n = c->vocab_size * C + c->block_size * C + c->n_layer * (12 * C * C + 13 * C) + 2 * C;
    return non_embedding ? n - c->block_size * C : n;
}

bool gpt2_param_is_matrix(const gpt2 *m, int32_t i) {
    int32_t rank = 0;
    loom_tensor_rank(m->params[i], &rank);
    return rank >= 2;
}

/* Dropout p (0: none) of x from seed (NULL: none) in stream s. */
static loom_tensor *drop(loom_context *ctx, loom_tensor *x, double p, loom_tensor *seed,
                         int64_t s) {
    return p > 0 && seed ? loom_dropout(ctx, x, p, true, seed, s) : x;
}

/* Causal self-attention of x [B, T, C] with layer l's c_attn and c_proj, dropout as
 * gpt2_forward says. */
static loom_tensor *attention(loom_context *ctx, const gpt2 *m, loom_tensor *const *p,
                              loom_tensor *x, int64_t B, int64_t T, int64_t l, loom_tensor *seed) {
    int64_t C = m->cfg.n_embd, H = m->cfg.n_head, D = C / H;
    loom_tensor *qkv[3] = {0};
    loom_split(ctx, EX_SCOPED(ctx, "c_attn", loom_linear(ctx, x, p[S_ATTN_W], p[S_ATTN_B])), 3,
               (int64_t[]){C, C, C}, -1, qkv);
    const int32_t to_heads[4] = {0, 2, 1, 3}; /* [B, T, H, D] -> [B, H, T, D] and back */
    for (int i = 0; i < 3; i++)
        qkv[i] = loom_permute(ctx, loom_reshape(ctx, qkv[i], 4, (int64_t[]){B, T, H, D}), to_heads);
    loom_attention_options o;
    loom_attention_options_init(&o);
    o.causal = true;
    if (m->cfg.dropout > 0 && seed) {
        o.dropout_p = m->cfg.dropout;
        o.seed = seed;
        o.stream = 1 + 3 * l;
    }
    loom_tensor *y = loom_scaled_dot_product_attention_ex(ctx, qkv[0], qkv[1], qkv[2], &o);
    y = loom_reshape(ctx, loom_permute(ctx, y, to_heads), 3, (int64_t[]){B, T, C});
    return drop(ctx, EX_SCOPED(ctx, "c_proj", loom_linear(ctx, y, p[S_APROJ_W], p[S_APROJ_B])),
                m->cfg.dropout, seed, 2 + 3 * l);
}

loom_tensor *gpt2_forward(loom_context *ctx, const gpt2 *m, loom_tensor *idx, loom_tensor *seed) {
    int64_t shape[LOOM_MAX_RANK];
    if (loom_tensor_shape(idx, shape) != LOOM_OK)
        return NULL;
    int64_t B = shape[0], T = shape[1], C = m->cfg.n_embd;
    loom_tensor *pos = loom_slice(ctx, m->params[1], (int64_t[]){0, 0}, (int64_t[]){T, C}, NULL);
    double pd = m->cfg.dropout;
    /* module scopes as nanoGPT's module paths: transformer.wte, transformer.h.0.attn.c_attn,
     * transformer.h.0.mlp.c_fc, ..., transformer.ln_f, lm_head */
    loom_scope_push(ctx, "transformer");
    pos = EX_SCOPED(ctx, "wpe", pos);
    loom_tensor *tok = EX_SCOPED(ctx, "wte", loom_embedding(ctx, idx, m->params[0]));
    loom_tensor *x = EX_SCOPED(ctx, "drop", drop(ctx, loom_add(ctx, tok, pos), pd, seed, 0));
    for (int64_t l = 0; l < m->cfg.n_layer; l++) {
        char name[32];
        snprintf(name, sizeof name, "h.%" PRId64, l);
        loom_scope_push(ctx, name);
        loom_tensor *const *p = m->params + slot(l, 0);
        loom_tensor *h =
            EX_SCOPED(ctx, "ln_1", loom_layer_norm(ctx, x, 1, p[S_LN1_W], p[S_LN1_B], 1e-5));
        x = loom_add(ctx, x, EX_SCOPED(ctx, "attn", attention(ctx, m, p, h, B, T, l, seed)));
        h = EX_SCOPED(ctx, "ln_2", loom_layer_norm(ctx, x, 1, p[S_LN2_W], p[S_LN2_B], 1e-5));
        loom_scope_push(ctx, "mlp");
        h = EX_SCOPED(ctx, "c_fc", loom_linear(ctx, h, p[S_FC_W], p[S_FC_B]));
        h = EX_SCOPED(ctx, "gelu", loom_gelu_tanh(ctx, h));
        h = drop(ctx, EX_SCOPED(ctx, "c_proj", loom_linear(ctx, h, p[S_MPROJ_W], p[S_MPROJ_B])), pd,
                 seed, 3 + 3 * l);
        loom_scope_pop(ctx);
        x = loom_add(ctx, x, h);
        loom_scope_pop(ctx);
    }
    x = EX_SCOPED(
        ctx, "ln_f",
        loom_layer_norm(ctx, x, 1, m->params[m->n_params - 2], m->params[m->n_params - 1], 1e-5));
    loom_scope_pop(ctx);
    /* lm_head, tied to wte */
    return EX_SCOPED(ctx, "lm_head", loom_linear(ctx, x, m->params[0], NULL));
}
