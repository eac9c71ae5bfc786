/* Internal: one description of every op family, read by everything that would otherwise
 * repeat it: the CLI's case loader and benchmark, the tests' generic tables, the fuzz
 * targets, and (through linseq_op_table_json) the Python binding's struct layouts.
 *
 * An op is described by its problem struct and its grads struct, field by field:
 *   - sizes (int64: B, T, H, ...), options (bool, float, enum), the varlen pair
 *     (cu_seqlens, n_seqs) and the tensor pointers, each with its offset in the struct, so
 *     a generic loader can fill a problem and a binding can lay the struct out;
 *   - tensors, with their role (input, output, upstream gradient, gradient), the shape they
 *     have under a given problem (a function: shapes depend on options such as the decay
 *     kind or the state layout), the dims text for messages, and how to draw realistic
 *     values for benchmarks and tests;
 *   - the calls: forward(problem, exec, outputs) and backward(problem, exec, upstream,
 *     grads) over arrays in the table's order, so a caller never switches on the op;
 *   - the work per call: FLOPs as README "Benchmarks" defines them (the bytes follow from
 *     the tensors), the benchmark's default sizes and the options a benchmark runs with.
 * Each op's description is an ls_op in its family's folder, beside the entry points that
 * validate through it (check.h): in the op's entry file (src/ema/ema.c), or in <op>_op.c
 * where several ops share its parts (src/kda/kda_op.c); this folder holds what is generic. Adding an op: its description, one line in optable.c's list, its entry points,
 * kernels and test; docs/developer-guide.md walks through it. */
#ifndef LS_OPTABLE_H
#define LS_OPTABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/state_rows.h"
#include "linseq.h"

#define LS_OP_MAX_DIMS LINSEQ_OP_MAX_DIMS
#define LS_OP_MAX_TENSORS 24
#define LS_OP_MAX_OUT 4 /* outputs of one forward call */
#define LS_OP_MAX_GRADS 12
#define LS_OP_GRADS_BYTES (LS_OP_MAX_GRADS * sizeof(void *)) /* the largest grads struct */

/* How a struct field is stored: what a binding needs to lay the struct out. */
typedef enum ls_ctype {
    LS_CTYPE_I64,    /* int64_t */
    LS_CTYPE_F32,    /* float */
    LS_CTYPE_BOOL,   /* bool */
    LS_CTYPE_ENUM,   /* a C enum (int-sized) */
    LS_CTYPE_INT,    /* int */
    LS_CTYPE_PTR,    /* a pointer (float, int64 or void) */
    LS_CTYPE_STRIDES /* a linseq_strides: four int64 (batch, token, channel, state) */
} ls_ctype;

/* One field of a public struct, as a binding lays it out. */
typedef struct ls_field {
    const char *name; /* the C field name */
    ls_ctype type;
    size_t offset, size;
} ls_field;

/* A named enum value, as meta.json and Python spell it. */
typedef struct ls_enum_name {
    const char *name;
    int value;
} ls_enum_name;

/* A size of the problem ("B", "T", ...): an int64 field. */
typedef struct ls_size_desc {
    const char *name; /* the field name and meta.json's key */
    size_t offset;
    bool required;         /* >= 1 required; otherwise 0 means "the default" */
    int64_t bench_default; /* the benchmark's default (0: left at the struct's default) */
} ls_size_desc;

/* An option: a bool, float or enum field (never a size or a tensor). */
typedef struct ls_option_desc {
    const char *key;   /* meta.json's key (may differ from the field name) */
    const char *field; /* the C field name */
    ls_ctype type;     /* BOOL, F32 or ENUM */
    size_t offset;
    const ls_enum_name *names; /* ENUM: the accepted names, {NULL, 0}-terminated */
    int null_value;            /* ENUM: the value meta.json's null or absence stands for,
                                * or one of the two below */
} ls_option_desc;

#define LS_ENUM_KEEP (-1)     /* absent or null: the field keeps its value */
#define LS_ENUM_REQUIRED (-2) /* absent or null: an error */

/* A linseq_strides field of a problem: the element strides of the INPUT tensor it names. */
typedef struct ls_strides_desc {
    const char *field;  /* the C field name: "x_strides" */
    const char *tensor; /* the table's name of the INPUT it describes: "x" */
    size_t offset;
    /* The sizes its strides step over, in the order of linseq_strides (batch, token,
     * channel[, state]): returns 3 (no state axis) or 4. */
    int (*axes)(const void *p, int64_t *sizes);
} ls_strides_desc;

typedef enum ls_op_role {
    LS_ROLE_INPUT,    /* read by forward and backward (a problem struct field) */
    LS_ROLE_OUTPUT,   /* written by forward (a call argument) */
    LS_ROLE_UPSTREAM, /* read by backward: the gradient of an output (a call argument) */
    LS_ROLE_GRAD      /* written by backward (a grads struct field) */
} ls_op_role;

/* How realistic values of a tensor are drawn (bench, tests): see ls_op_fill. */
typedef enum ls_dist {
    LS_DIST_ZERO,
    LS_DIST_NORMAL,          /* a * N(0,1) */
    LS_DIST_UNIFORM,         /* U(a, b) */
    LS_DIST_LOG_UNIFORM,     /* exp(U(log a, log b)) */
    LS_DIST_LOGSIGMOID,      /* logsigmoid(N(0,1)): a decay log, mean about -0.8 */
    LS_DIST_SIGMOID,         /* sigmoid(N(0,1)): beta */
    LS_DIST_LOG_OF_UNIFORM,  /* log(U(a, b)): A_log */
    LS_DIST_INV_SOFTPLUS_DT, /* softplus^-1 of dt ~ logU(a, b): dt_bias's usual init */
    LS_DIST_S4D_REAL         /* -(n+1) over the last dim: Mamba's S4D-real A */
} ls_dist;

/* The shape of a tensor under problem p: returns its rank (0 when the tensor does not exist
 * with p's options, e.g. g without decay) and writes the dims. */
typedef int (*ls_shape_fn)(const void *p, int64_t *dims);

typedef struct ls_tensor_desc {
    const char *name; /* case file / Python name: "q", "dA_log", "d_o" */
    ls_op_role role;
    /* INPUT: the problem field; GRAD: the grads field; OUTPUT, UPSTREAM: NULL          */
    const char *field;
    size_t offset;    /* of field; OUTPUT / UPSTREAM: the call argument's index */
    bool required;    /* an INPUT the op cannot run without (when it exists) */
    const char *dims; /* "[B,T,H,K]" for messages */
    ls_shape_fn shape;
    const char *case_flag; /* meta.json's flag that says whether the file is present */
    const char *grad_of;   /* GRAD: the input; UPSTREAM: the output */
    ls_dist dist;          /* realistic values (inputs and upstream gradients) */
    double a, b;
    bool bench; /* an optional INPUT the benchmark passes */
    /* A per-token tensor, whose element type follows exec->dtype (float32 or bf16); every
     * other tensor is float32 whatever the dtype. */
    bool token;
    /* OUTPUT: the INPUT it may be exactly (the same buffer, updated in place), or NULL. */
    const char *alias_of;
    /* A float32 INPUT (not per-token) whose every value must lie in [lo, hi] (so never NaN):
     * checked by ls_op_check_values, on the host; set with LS_VALUES_IN(lo, hi). */
    bool bounded;
    double lo, hi;
} ls_tensor_desc;

#define LS_VALUES_IN(lo_, hi_) .bounded = true, .lo = (lo_), .hi = (hi_)

typedef struct ls_op {
    const char *name;         /* meta.json's "op": "kda", "kda_gate", "ssm1", ... */
    const char *problem_type; /* "linseq_kda_problem" */
    const char *entry_stem;   /* the entry points' stem when it is not the problem type's
                               * ("linseq_kda_segment": _forward, _backward); NULL: that */
    const char *grads_type;   /* "linseq_kda_grads"; NULL for a forward-only op */
    size_t problem_size, grads_size;
    const ls_size_desc *sizes;
    int n_sizes;
    const ls_option_desc *options;
    int n_options;
    bool has_modes; /* exec's mode and chunk size apply (KDA, SSD) */
    bool varlen;    /* has cu_seqlens and n_seqs */
    size_t cu_seqlens_offset, n_seqs_offset;
    /* Every field of the problem struct is a size, an option, the varlen pair or an INPUT
     * tensor, and every field of the grads struct a GRAD tensor: the layout a binding needs
     * follows from these lists (tests check that they tile each struct exactly). */
    const ls_tensor_desc *tensors;
    int n_tensors;
    /* The strides fields of the per-token inputs (none for most ops). */
    const ls_strides_desc *strides;
    int n_strides;

    /* out[i]: the i-th OUTPUT tensor of the table (NULL allowed where the API allows). */
    linseq_status (*forward)(const void *p, const linseq_exec *exec, float *const *out);
    /* upstream[i]: the i-th UPSTREAM tensor; grads: the bytes of the op's grads struct
     * (ls_op_backward fills them from an array; the op copies them into its typed struct).
     * NULL for a forward-only op, which then has no UPSTREAM or GRAD tensors, no grads struct
     * (grads_type NULL, grads_size 0) and no training step; every generic consumer skips what
     * an op does not have, as it does for decode == NULL. */
    linseq_status (*backward)(const void *p, const linseq_exec *exec, const float *const *upstream,
                              const void *grads);
    /* FLOPs of one forward call (README "Benchmarks"); exec picks KDA's mode and chunk. */
    double (*flops)(const void *p, const linseq_exec *exec);
    /* The options a benchmark runs with (l2norm on, a gate, a bias...), set on a problem
     * whose sizes are already filled; NULL: the problem's defaults. */
    void (*bench_options)(void *p);

    /* The benchmark's commands (tools/linseq/bench.c): the forward as bench_name (NULL:
     * name), a training step as "<bench_name>-fwdbwd" when bench_fwdbwd, and one decode
     * step as "<bench_name>-decode" when decode is set. */
    const char *bench_name;
    bool bench_fwdbwd;
    /* A training step whose forward keeps what its backward needs (NULL where the op has
     * none; its step is forward, then backward): the size of that block, the forward that
     * writes it, the backward that reads it (upstream and grads as backward's). */
    linseq_status (*saved_size)(const void *p, const linseq_exec *exec, size_t *bytes);
    linseq_status (*forward_train)(const void *p, const linseq_exec *exec, float *const *out,
                                   void *saved, size_t saved_bytes);
    linseq_status (*backward_saved)(const void *p, const linseq_exec *exec, const void *saved,
                                    size_t saved_bytes, const float *const *upstream,
                                    const void *grads);
    /* One token (T = 1) for each of B requests whose states are rows of a pool of n_rows
     * rows, each shaped like the INPUT named decode_state at B = 1: request b's state is
     * row rows[b] (NULL: row b), read and updated in place. out as forward's; the OUTPUT
     * named decode_state_out is the state itself and is not passed. */
    linseq_status (*decode)(const void *p, const linseq_exec *exec, float *pool, int64_t n_rows,
                            const int64_t *rows, float *const *out);
    /* The same step over rows as a serving engine's pool holds them (core/state_rows.h:
     * any element type and stride, another destination row), each request's state read
     * once and written once, converted through the thread's own scratch. Optional: without
     * it the pool layer gathers the rows into a float32 block for decode. */
    linseq_status (*decode_rows)(const void *p, const linseq_exec *exec, const ls_state_rows *rows,
                                 int64_t n_rows, float *const *out);
    /* Whether decode_rows takes problem p over rows of that type (NULL: every problem and
     * type); the others are gathered. */
    bool (*decode_rows_takes)(const void *p, linseq_pool_dtype dtype);
    const char *decode_state, *decode_state_out;
} ls_op;

/* Every op, in a fixed order; *count receives their number. */
const ls_op *const *ls_ops(int *count);
/* The op of that name, or NULL. */
const ls_op *ls_op_find(const char *name);

/* The backward through an array of gradients in table order (grads[i]: the i-th GRAD
 * tensor, NULL: not computed), packed into the op's grads struct. */
linseq_status ls_op_backward(const ls_op *op, const void *p, const linseq_exec *exec,
                             const float *const *upstream, float *const *grads);

/* Every field of op's problem struct (grads: of its grads struct), sorted by offset, into
 * out (LS_OP_MAX_FIELDS entries); returns the count. */
#define LS_OP_MAX_FIELDS 48
int ls_op_fields(const ls_op *op, bool grads, ls_field *out);
/* The fields of linseq_exec. */
const ls_field *ls_exec_fields(int *count);
/* The fields of linseq_state_pool, likewise ("state_pool" in the JSON). */
const ls_field *ls_state_pool_fields(int *count);

/* The tensors of a role, in table order: the i-th of them, or NULL past the end. */
const ls_tensor_desc *ls_op_tensor(const ls_op *op, ls_op_role role, int i);
int ls_op_count(const ls_op *op, ls_op_role role);
/* The tensor of that name and role, or NULL. */
const ls_tensor_desc *ls_op_tensor_named(const ls_op *op, ls_op_role role, const char *name);

/* t's dims text under the problem p's options, into buf (n bytes, truncated): dims of the form
 * "[D,W] ([W,D] weight_tap_major)" give the second when that boolean option is set, the first
 * otherwise; other dims as they are. Returns buf. */
const char *ls_tensor_dims(const ls_op *op, const ls_tensor_desc *t, const void *p, char *buf,
                           size_t n);

/* Elements of a tensor under p (0 when it does not exist); false when the count does not
 * fit in int64. */
bool ls_tensor_count(const ls_tensor_desc *t, const void *p, int64_t *count);

/* The pointer a problem (INPUT) or grads (GRAD) struct holds for t, and setting it. */
const void *ls_tensor_get(const ls_tensor_desc *t, const void *strct);
void ls_tensor_set(const ls_tensor_desc *t, void *strct, const void *ptr);

/* Fields of a problem struct by descriptor. */
int64_t ls_size_get(const ls_size_desc *s, const void *p);
void ls_size_set(const ls_size_desc *s, void *p, int64_t value);
/* The varlen fields (only for op->varlen). */
void ls_op_set_varlen(const ls_op *op, void *p, const int64_t *cu_seqlens, int64_t n_seqs);
const int64_t *ls_op_cu_seqlens(const ls_op *op, const void *p);

/* The name of an enum option's value, or NULL. */
const char *ls_enum_value_name(const ls_option_desc *o, int value);

/* Fills x[0 .. n) with values of t's distribution, from a seed; the same values whatever
 * the thread count (blocks of values have their own generators). */
void ls_op_fill(const ls_tensor_desc *t, float *x, int64_t n, const int64_t *dims, int ndim,
                uint64_t seed);

#endif
