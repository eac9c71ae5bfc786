/* The bad-input table of every public entry point. Each row takes a valid call of one entry
 * point, breaks one argument in one way, and expects
 *   (a) the specific status,
 *   (b) a message from linseq_last_error() that names the function and the argument,
 *   (c) every buffer the call can see unchanged, byte for byte: the outputs (poisoned with a
 *       byte pattern before the call) and the inputs,
 * then the arena is restored for the next row. A second, shorter table lists the unusual
 * calls that are valid (the documented aliasing, optional arguments, absurd thread counts).
 *
 * Two kinds of rows: op_table_rows derives from the op table (src/optable) every row that
 * follows from an op's description (required tensors NULL, misalignment, sizes out of range
 * or overflowing, enums out of range, outputs over inputs and over each other, the exec,
 * cu_seqlens) for every op's forward and backward, so a new op is covered by its table
 * entry; the hand-written rows keep each op's own rules (HV % H, G | D, the gate's ranges,
 * gradients of absent inputs...) and the KDA entry points outside the table (decode, the
 * training calls, the size query). */
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "optable/optable.h"
#include "testutil.h"

/* KDA: two sequences of 5 tokens (or one varlen row of 10), GVA with 2 value heads per qk
 * head; the SSM1 and conv1d problems share B and T. */
enum { B = 2, T = 5, H = 2, HV = 4, K = 8, V = 6, POOL_ROWS = 5 };
enum { D = 8, N = 4, G = 2, W = 4, SEQS = 2 };
enum { SAVED_FLOATS = 2048, PAD = 16 };

/* Every buffer of every call, in one block so that one memcmp sees any write. Each tensor is
 * followed by a pad, so that an output shifted by one element overlaps only the tensor the
 * row names. The inputs come first; everything from `o` on is an output and poisoned. */
#define BUF(type, name, n)                                                                         \
    type name[n];                                                                                  \
    type name##_pad[PAD]
/* The sizes are products, not pointer declarations, whatever clang-format guesses. */
/* clang-format off */
typedef struct arena {
    BUF(int64_t, cu, SEQS + 1);
    BUF(int64_t, rows, B);
    /* KDA inputs */
    BUF(float, q, B * T * H * K);
    BUF(float, k, B * T * H * K);
    BUF(float, v, B * T * HV * V);
    BUF(float, beta, B * T * HV);
    BUF(float, g, B * T * HV * K);
    BUF(float, h0, B * HV * K * V);
    BUF(float, A_log, HV);
    BUF(float, dt_bias, HV * K);
    BUF(float, d_o, B * T * HV * V);
    BUF(float, d_ht, B * HV * K * V);
    BUF(float, pool, POOL_ROWS * HV * K * V); /* decode's state: read and written in place */
    BUF(float, saved_in, SAVED_FLOATS);       /* what forward_train wrote for the valid call */
    /* gate inputs */
    BUF(float, g_raw, B * T * H * K);
    BUF(float, d_g, B * T * H * K);
    /* SSM1 and conv1d inputs */
    BUF(float, x, B * T * D);
    BUF(float, dt, B * T * D);
    BUF(float, A, D * N);
    BUF(float, B_proj, B * T * G * N);
    BUF(float, C_proj, B * T * G * N);
    BUF(float, D_skip, D);
    BUF(float, gate, B * T * D);
    BUF(float, s_dt_bias, D);
    BUF(float, s_h0, B * D * N);
    BUF(float, d_y, B * T * D);
    BUF(float, d_hT, B * D * N);
    BUF(float, weight, D * W);
    BUF(float, bias, D);
    BUF(float, c_state, B * D * (W - 1));
    BUF(float, d_c_state_out, B * D * (W - 1));
    /* outputs */
    BUF(float, o, B * T * HV * V);
    BUF(float, ht, B * HV * K * V);
    BUF(float, saved_out, SAVED_FLOATS);
    BUF(float, dq, B * T * H * K);
    BUF(float, dk, B * T * H * K);
    BUF(float, dv, B * T * HV * V);
    BUF(float, dbeta, B * T * HV);
    BUF(float, dg, B * T * HV * K);
    BUF(float, dh0, B * HV * K * V);
    BUF(float, dA_log, HV);
    BUF(float, ddt_bias, HV * K);
    BUF(float, gate_g, B * T * H * K);
    BUF(float, dg_raw, B * T * H * K);
    BUF(float, gate_dA_log, H);
    BUF(float, gate_ddt_bias, H * K);
    BUF(float, y, B * T * D);
    BUF(float, hT, B * D * N);
    BUF(float, dx, B * T * D);
    BUF(float, ddt, B * T * D);
    BUF(float, dA, D * N);
    BUF(float, dB_proj, B * T * G * N);
    BUF(float, dC_proj, B * T * G * N);
    BUF(float, dD_skip, D);
    BUF(float, dgate, B * T * D);
    BUF(float, s_dh0, B * D * N);
    BUF(float, s_ddt_bias, D);
    BUF(float, c_state_out, B * D * (W - 1));
    BUF(float, dweight, D * W);
    BUF(float, dbias, D);
    BUF(float, dc_state, B * D * (W - 1));
    BUF(size_t, bytes, 1);
} arena;
/* clang-format on */
#undef BUF

#define OUTPUTS_AT offsetof(arena, o)

static arena *A;          /* the arena the calls see */
static arena *pristine;   /* its state before every row: inputs filled, outputs poisoned */
static arena *before;     /* its state just before the call of the current row */
static size_t saved_need; /* linseq_kda_saved_size of the valid KDA problem */

typedef enum {
    KDA_FORWARD,
    KDA_DECODE,
    KDA_BACKWARD,
    KDA_SAVED_SIZE,
    KDA_FORWARD_TRAIN,
    KDA_BACKWARD_SAVED,
    GATE_FORWARD,
    GATE_BACKWARD,
    SSM1_FORWARD,
    SSM1_BACKWARD,
    CONV_FORWARD,
    CONV_BACKWARD,
    SET_THREADS,
    N_OPS
} op_id;

static const char *const fn_name[N_OPS] = {
    "linseq_kda_forward",      "linseq_kda_decode",        "linseq_kda_backward",
    "linseq_kda_saved_size",   "linseq_kda_forward_train", "linseq_kda_backward_saved",
    "linseq_kda_gate_forward", "linseq_kda_gate_backward", "linseq_ssm1_forward",
    "linseq_ssm1_backward",    "linseq_conv1d_forward",    "linseq_conv1d_backward",
    "linseq_set_num_threads"};

/* Every argument of every entry point; a call uses the ones of its op. */
typedef struct call {
    op_id op;
    bool no_problem, no_grads; /* pass NULL for the problem / the grads struct */
    linseq_exec exec;
    linseq_kda_problem kda;
    linseq_kda_grads kda_grads;
    linseq_kda_gate_problem gate;
    linseq_kda_gate_grads gate_grads;
    linseq_ssm1_problem ssm;
    linseq_ssm1_grads ssm_grads;
    linseq_conv1d_problem conv;
    linseq_conv1d_grads conv_grads;
    float *o, *ht, *y, *hT, *conv_state_out, *g;
    const float *d_o, *d_ht, *d_y, *d_hT, *d_conv_state_out, *d_g;
    float *state;
    int64_t n_state_rows;
    const int64_t *state_rows;
    void *saved_out;
    const void *saved_in;
    size_t saved_bytes;
    size_t *bytes;
    int n_threads;
} call;

static linseq_kda_problem valid_kda(void)
{
    return (linseq_kda_problem){.B = B,
                                .T = T,
                                .H = H,
                                .HV = HV,
                                .K = K,
                                .V = V,
                                .q = A->q,
                                .k = A->k,
                                .v = A->v,
                                .beta = A->beta,
                                .g = A->g,
                                .h0 = A->h0,
                                .decay = LINSEQ_DECAY_PER_CHANNEL,
                                .qk_l2norm = true,
                                .gate_in_kernel = true,
                                .A_log = A->A_log,
                                .dt_bias = A->dt_bias};
}

/* A valid call of op: every optional input and output present, so that each can be broken. */
static call valid_call(op_id op)
{
    call c = {.op = op};
    c.kda = valid_kda();
    c.kda_grads = (linseq_kda_grads){.dq = A->dq,
                                     .dk = A->dk,
                                     .dv = A->dv,
                                     .dbeta = A->dbeta,
                                     .dg = A->dg,
                                     .dh0 = A->dh0,
                                     .dA_log = A->dA_log,
                                     .ddt_bias = A->ddt_bias};
    c.o = A->o;
    c.ht = A->ht;
    c.d_o = A->d_o;
    c.d_ht = A->d_ht;
    if (op == KDA_DECODE) {
        c.kda.T = 1;
        c.kda.h0 = NULL;
        c.state = A->pool;
        c.n_state_rows = POOL_ROWS;
        c.state_rows = A->rows;
    }
    c.saved_out = A->saved_out;
    c.saved_in = A->saved_in;
    c.saved_bytes = saved_need;
    c.bytes = A->bytes;

    c.gate = (linseq_kda_gate_problem){.B = B,
                                       .T = T,
                                       .H = H,
                                       .K = K,
                                       .decay = LINSEQ_DECAY_PER_CHANNEL,
                                       .g_raw = A->g_raw,
                                       .A_log = A->A_log,
                                       .dt_bias = A->dt_bias};
    c.gate_grads = (linseq_kda_gate_grads){
        .dg_raw = A->dg_raw, .dA_log = A->gate_dA_log, .ddt_bias = A->gate_ddt_bias};
    c.g = A->gate_g;
    c.d_g = A->d_g;

    c.ssm = (linseq_ssm1_problem){.B = B,
                                  .T = T,
                                  .D = D,
                                  .N = N,
                                  .G = G,
                                  .x = A->x,
                                  .dt = A->dt,
                                  .A = A->A,
                                  .B_proj = A->B_proj,
                                  .C_proj = A->C_proj,
                                  .D_skip = A->D_skip,
                                  .gate = A->gate,
                                  .h0 = A->s_h0,
                                  .dt_softplus = true,
                                  .dt_bias = A->s_dt_bias};
    c.ssm_grads = (linseq_ssm1_grads){.dx = A->dx,
                                      .ddt = A->ddt,
                                      .dA = A->dA,
                                      .dB_proj = A->dB_proj,
                                      .dC_proj = A->dC_proj,
                                      .dD_skip = A->dD_skip,
                                      .dgate = A->dgate,
                                      .dh0 = A->s_dh0,
                                      .ddt_bias = A->s_ddt_bias};
    c.y = A->y;
    c.hT = A->hT;
    c.d_y = A->d_y;
    c.d_hT = A->d_hT;

    c.conv = (linseq_conv1d_problem){.B = B,
                                     .T = T,
                                     .D = D,
                                     .W = W,
                                     .x = A->x,
                                     .weight = A->weight,
                                     .bias = A->bias,
                                     .conv_state = A->c_state,
                                     .activation = LINSEQ_ACT_SILU};
    c.conv_grads = (linseq_conv1d_grads){
        .dx = A->dx, .dweight = A->dweight, .dbias = A->dbias, .dconv_state = A->dc_state};
    c.conv_state_out = A->c_state_out;
    c.d_conv_state_out = A->d_c_state_out;
    c.n_threads = 0; /* the default */
    return c;
}

/* The same tokens as one packed row of two sequences (4 and 6 tokens). */
static void varlen(call *c)
{
    A->cu[0] = 0, A->cu[1] = 4, A->cu[2] = 2 * T;
    c->kda.B = c->ssm.B = c->conv.B = 1;
    c->kda.T = c->ssm.T = c->conv.T = 2 * T;
    c->kda.cu_seqlens = c->ssm.cu_seqlens = c->conv.cu_seqlens = A->cu;
    c->kda.n_seqs = c->ssm.n_seqs = c->conv.n_seqs = SEQS;
}

static linseq_status invoke(const call *c)
{
    const linseq_exec *ex = &c->exec;
    const linseq_kda_problem *kp = c->no_problem ? NULL : &c->kda;
    const linseq_kda_grads *kg = c->no_grads ? NULL : &c->kda_grads;
    switch (c->op) {
    case KDA_FORWARD: return linseq_kda_forward(kp, ex, c->o, c->ht);
    case KDA_DECODE:
        return linseq_kda_decode(kp, ex, c->state, c->n_state_rows, c->state_rows, c->o);
    case KDA_BACKWARD: return linseq_kda_backward(kp, ex, c->d_o, c->d_ht, kg);
    case KDA_SAVED_SIZE: return linseq_kda_saved_size(kp, ex, c->bytes);
    case KDA_FORWARD_TRAIN:
        return linseq_kda_forward_train(kp, ex, c->o, c->ht, c->saved_out, c->saved_bytes);
    case KDA_BACKWARD_SAVED:
        return linseq_kda_backward_saved(kp, ex, c->saved_in, c->saved_bytes, c->d_o, c->d_ht, kg);
    case GATE_FORWARD: return linseq_kda_gate_forward(c->no_problem ? NULL : &c->gate, ex, c->g);
    case GATE_BACKWARD:
        return linseq_kda_gate_backward(c->no_problem ? NULL : &c->gate, ex, c->d_g,
                                        c->no_grads ? NULL : &c->gate_grads);
    case SSM1_FORWARD: return linseq_ssm1_forward(c->no_problem ? NULL : &c->ssm, ex, c->y, c->hT);
    case SSM1_BACKWARD:
        return linseq_ssm1_backward(c->no_problem ? NULL : &c->ssm, ex, c->d_y, c->d_hT,
                                    c->no_grads ? NULL : &c->ssm_grads);
    case CONV_FORWARD:
        return linseq_conv1d_forward(c->no_problem ? NULL : &c->conv, ex, c->y, c->conv_state_out);
    case CONV_BACKWARD:
        return linseq_conv1d_backward(c->no_problem ? NULL : &c->conv, ex, c->d_y,
                                      c->d_conv_state_out, c->no_grads ? NULL : &c->conv_grads);
    case SET_THREADS: return linseq_set_num_threads(c->n_threads);
    case N_OPS: break;
    }
    return LINSEQ_ERR_UNSUPPORTED;
}

static int rows_run;

static void run_row(const call *c, const char *what, int line, linseq_status want,
                    const char *needle)
{
    rows_run++;
    memcpy(before, A, sizeof *A);
    const int threads_before = linseq_get_num_threads();
    const linseq_status st = invoke(c);
    const char *msg = linseq_last_error();
    CHECK(st == want, "line %d, %s, %s: status %s, expected %s (%s)", line, fn_name[c->op], what,
          linseq_status_string(st), linseq_status_string(want), msg);
    CHECK(strstr(msg, fn_name[c->op]) != NULL && strstr(msg, needle) != NULL,
          "line %d, %s, %s: message \"%s\" does not name \"%s\"", line, fn_name[c->op], what, msg,
          needle);
    CHECK(tu_is_poisoned((const char *)A + OUTPUTS_AT, sizeof *A - OUTPUTS_AT),
          "line %d, %s, %s: an output byte was written", line, fn_name[c->op], what);
    CHECK(memcmp(before, A, sizeof *A) == 0, "line %d, %s, %s: a buffer changed", line,
          fn_name[c->op], what);
    CHECK(linseq_get_num_threads() == threads_before, "line %d, %s, %s: the thread setting changed",
          line, fn_name[c->op], what);
    memcpy(A, pristine, sizeof *A);
}

/* A row: op, the status and message fragment it must give, then the statements that break a
 * valid call `c` (a call *). The statements are the row's label. */
#define ROW(op_, want_, needle_, ...)                                                              \
    do {                                                                                           \
        call row_ = valid_call(op_);                                                               \
        call *c = &row_;                                                                           \
        (void)c;                                                                                   \
        __VA_ARGS__;                                                                               \
        run_row(&row_, #__VA_ARGS__, __LINE__, want_, needle_);                                    \
    } while (0)

/* A call that looks wrong but is valid: it must succeed and leave no message. */
#define ACCEPT(op_, ...)                                                                           \
    do {                                                                                           \
        call row_ = valid_call(op_);                                                               \
        call *c = &row_;                                                                           \
        (void)c;                                                                                   \
        __VA_ARGS__;                                                                               \
        const linseq_status st_ = invoke(&row_);                                                   \
        CHECK(st_ == LINSEQ_OK && linseq_last_error()[0] == '\0',                                  \
              "line %d, %s, %s: a valid call gave %s (%s)", __LINE__, fn_name[op_], #__VA_ARGS__,  \
              linseq_status_string(st_), linseq_last_error());                                     \
        memcpy(A, pristine, sizeof *A);                                                            \
    } while (0)

/* A pointer one byte past p: misaligned for any element type. */
#define MISALIGN(type, p) ((type *)(void *)((char *)(p) + 1))

/* ---------------------------------------------------------------------------------------- */
/* Rows shared by entry points                                                                */
/* ---------------------------------------------------------------------------------------- */

/* The exec's fields out of range: every entry point checks the whole exec. */
typedef struct exec_case {
    linseq_exec exec;
    linseq_status want;
    const char *needle;
} exec_case;

static const exec_case exec_cases[] = {
    {{.mode = (linseq_mode)3}, LINSEQ_ERR_INVALID_ENUM, "exec->mode = 3"},
    {{.mode = (linseq_mode)-1}, LINSEQ_ERR_INVALID_ENUM, "exec->mode = -1"},
    {{.chunk_size = 48}, LINSEQ_ERR_INVALID_VALUE, "chunk_size = 48"},
    {{.chunk_size = 8}, LINSEQ_ERR_INVALID_VALUE, "chunk_size = 8"},
    {{.chunk_size = 256}, LINSEQ_ERR_INVALID_VALUE, "chunk_size = 256"},
    {{.chunk_size = -64}, LINSEQ_ERR_INVALID_VALUE, "chunk_size = -64"},
    {{.threads = -1}, LINSEQ_ERR_INVALID_VALUE, "threads = -1"},
    {{.threads = INT_MIN}, LINSEQ_ERR_INVALID_VALUE, "threads"},
    {{.device = (linseq_device)2}, LINSEQ_ERR_INVALID_ENUM, "exec->device = 2"},
    {{.device = (linseq_device)-1}, LINSEQ_ERR_INVALID_ENUM, "exec->device = -1"},
    {{.dtype = (linseq_dtype)2}, LINSEQ_ERR_INVALID_ENUM, "exec->dtype = 2"},
    {{.dtype = (linseq_dtype)-1}, LINSEQ_ERR_INVALID_ENUM, "exec->dtype = -1"},
    /* (not a bad input for the calls that take bf16 on the CPU: cpu_bf16 skips it there) */
    {{.dtype = LINSEQ_DTYPE_BF16}, LINSEQ_ERR_UNSUPPORTED, "takes float32 tensors"},
#ifdef LINSEQ_WITH_CUDA
    {{.device = LINSEQ_DEVICE_CUDA, .device_index = -1},
     LINSEQ_ERR_INVALID_VALUE,
     "exec->device_index = -1"},
#else
    {{.device = LINSEQ_DEVICE_CUDA}, LINSEQ_ERR_UNSUPPORTED, "no CUDA support"},
#endif
};
#define N_EXEC_CASES ((int)(sizeof exec_cases / sizeof exec_cases[0]))

/* The calls whose CPU kernels also take bf16 per-token tensors (test_kda_bf16.c,
 * test_conv1d.c). */
static bool cpu_bf16(const char *fn)
{
    return strcmp(fn, "linseq_kda_forward") == 0 || strcmp(fn, "linseq_kda_decode") == 0 ||
           strcmp(fn, "linseq_conv1d_forward") == 0;
}

static void exec_rows(op_id op)
{
    for (int i = 0; i < N_EXEC_CASES; i++) {
        if (exec_cases[i].exec.dtype == LINSEQ_DTYPE_BF16 && cpu_bf16(fn_name[op])) continue;
        ROW(op, exec_cases[i].want, exec_cases[i].needle, c->exec = exec_cases[i].exec);
    }
}

/* The offsets of a packed row: B must be 1, n_seqs >= 1, 0 = cu[0] <= ... <= cu[n] = T. */
static void cu_seqlens_rows(op_id op)
{
    ROW(op, LINSEQ_ERR_SHAPE_MISMATCH, "B must be 1", varlen(c),
        c->kda.B = c->ssm.B = c->conv.B = 2, c->kda.T = c->ssm.T = c->conv.T = T, A->cu[2] = T);
    ROW(op, LINSEQ_ERR_INVALID_CU_SEQLENS, "cu_seqlens[0] = 1", varlen(c), A->cu[0] = 1);
    ROW(op, LINSEQ_ERR_INVALID_CU_SEQLENS, "cu_seqlens[0] = -1", varlen(c), A->cu[0] = -1);
    ROW(op, LINSEQ_ERR_INVALID_CU_SEQLENS, "decreases at index 2", varlen(c), A->cu[1] = 11);
    ROW(op, LINSEQ_ERR_INVALID_CU_SEQLENS, "expected T = 10", varlen(c), A->cu[2] = 9);
    ROW(op, LINSEQ_ERR_INVALID_CU_SEQLENS, "expected T = 10", varlen(c), A->cu[2] = 11);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "n_seqs = 0", varlen(c),
        c->kda.n_seqs = c->ssm.n_seqs = c->conv.n_seqs = 0);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "n_seqs = -1", varlen(c),
        c->kda.n_seqs = c->ssm.n_seqs = c->conv.n_seqs = -1);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "n_seqs", varlen(c),
        c->kda.n_seqs = c->ssm.n_seqs = c->conv.n_seqs = INT64_MAX);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'cu_seqlens'", varlen(c),
        c->kda.cu_seqlens = c->ssm.cu_seqlens = c->conv.cu_seqlens =
            MISALIGN(const int64_t, A->cu));
}

/* The KDA entry points outside the op table (decode, the training calls, the size query) get
 * here the rows that op_table_rows makes for the forward and the backward from the table:
 * the problem, its sizes and enum, the exec, the tensors NULL, misaligned or too large. */
static void kda_problem_rows(op_id op)
{
    ROW(op, LINSEQ_ERR_NULL_POINTER, "problem", c->no_problem = true);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "B = 0", c->kda.B = 0);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "B = -2", c->kda.B = -2);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "T = 0", c->kda.T = 0);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "T = -3", c->kda.T = -3);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "H = 0", c->kda.H = 0);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "size HV = -4", c->kda.HV = -4);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "K = 0", c->kda.K = 0);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "size V = 0", c->kda.V = 0);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "size V = -1", c->kda.V = -1);
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "decay = 3", c->kda.decay = (linseq_decay)3);
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "decay = -1", c->kda.decay = (linseq_decay)-1);
    exec_rows(op);
}

static void kda_tensor_rows(op_id op)
{
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'q' is NULL", c->kda.q = NULL);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'k' is NULL", c->kda.k = NULL);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'v' is NULL", c->kda.v = NULL);
    /* beta is optional (NULL: no delta rule), but its gradient then has nothing to be of */
    if (op == KDA_BACKWARD || op == KDA_BACKWARD_SAVED)
        ROW(op, LINSEQ_ERR_INVALID_VALUE, "grads->dbeta is given but 'beta' is NULL",
            c->kda.beta = NULL);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'g' is NULL", c->kda.g = NULL);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'q'", c->kda.q = MISALIGN(const float, A->q));
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'dt_bias'",
        c->kda.dt_bias = MISALIGN(const float, A->dt_bias));
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'q'", c->kda.B = (int64_t)1 << 62);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'q'", c->kda.B = INT64_MAX);
    if (op != KDA_DECODE) {
        ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'q'", c->kda.T = (int64_t)1 << 60);
        cu_seqlens_rows(op);
    }
}

/* The rules of a KDA problem, for every KDA entry point: GVA, decay and gate consistency,
 * the scalar options' ranges, and the products of sizes the table's rows do not make. */
static void kda_rule_rows(op_id op)
{
    ROW(op, LINSEQ_ERR_SHAPE_MISMATCH, "HV = 3 is not a multiple of H = 2", c->kda.HV = 3);
    ROW(op, LINSEQ_ERR_SHAPE_MISMATCH, "HV = 1 is not a multiple of H = 2", c->kda.HV = 1);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'g' is given but decay is LINSEQ_DECAY_NONE",
        c->kda.gate_in_kernel = false, c->kda.A_log = c->kda.dt_bias = NULL,
        c->kda.decay = LINSEQ_DECAY_NONE);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "gate_in_kernel needs a decay", c->kda.g = NULL,
        c->kda.decay = LINSEQ_DECAY_NONE);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "A_log", c->kda.gate_in_kernel = false,
        c->kda.dt_bias = NULL);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "dt_bias", c->kda.gate_in_kernel = false,
        c->kda.A_log = NULL);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "lower_bound", c->kda.gate_in_kernel = false,
        c->kda.A_log = c->kda.dt_bias = NULL, c->kda.lower_bound = -5.0f);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "lower_bound = 1", c->kda.lower_bound = 1.0f);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "lower_bound = nan", c->kda.lower_bound = NAN);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "lower_bound = -inf", c->kda.lower_bound = -INFINITY);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "lower_bound = inf", c->kda.lower_bound = INFINITY);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "scale = nan", c->kda.scale = NAN);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "scale = inf", c->kda.scale = INFINITY);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "scale = -inf", c->kda.scale = -INFINITY);
    /* K*V = 2^62: the forwards refuse the working state before the tensors, the backwards
     * name the state tensor h0, the size query the saved states */
    const char *kv_needle = op == KDA_SAVED_SIZE                             ? "saved states"
                            : op == KDA_BACKWARD || op == KDA_BACKWARD_SAVED ? "'h0'"
                                                                             : "K*V";
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, kv_needle, c->kda.B = c->kda.H = 1, c->kda.HV = 0,
        c->kda.K = c->kda.V = (int64_t)1 << 31);
    /* HV*K overflows while each fits (g, and dt_bias with the gate in the kernel) */
    if (op != KDA_SAVED_SIZE)
        ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'g'", c->kda.H = 1,
            c->kda.HV = c->kda.K = (int64_t)1 << 32);
}

/* ---------------------------------------------------------------------------------------- */
/* KDA                                                                                        */
/* ---------------------------------------------------------------------------------------- */

/* The forward's outputs, for forward_train (the table's rows cover linseq_kda_forward). */
static void kda_output_rows(op_id op)
{
    ROW(op, LINSEQ_ERR_NULL_POINTER, "output 'o' is NULL", c->o = NULL);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'o'", c->o = MISALIGN(float, A->o));
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'ht'", c->ht = MISALIGN(float, A->ht));
    ROW(op, LINSEQ_ERR_ALIASING, "output 'o' overlaps input 'q'", c->o = A->q);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'o' overlaps input 'k'", c->o = A->k + 3);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'o' overlaps input 'v'", c->o = A->v);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'o' overlaps input 'beta'", c->o = A->beta - 1);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'o' overlaps input 'A_log'", c->o = A->A_log);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'o' overlaps input 'cu_seqlens'", varlen(c),
        c->kda.cu_seqlens = (const int64_t *)(void *)A->o);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'ht' overlaps input 'g'", c->ht = A->g);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'ht' overlaps input 'h0'", c->ht = A->h0 + 1);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'o' overlaps output 'ht'", c->ht = A->o + 8);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'o' overlaps output 'ht'", c->ht = A->o);
}

static void kda_forward_rows(op_id op)
{
    kda_rule_rows(op);
    /* ht may be h0 itself (in place), nothing else that touches it: here ht starts one float
     * before h0, formed inside g's pad (h0 - 1 would index h0 out of its bounds) */
    _Static_assert(offsetof(arena, h0) == offsetof(arena, g_pad) + PAD * sizeof(float),
                   "h0 follows g's pad directly");
    ROW(op, LINSEQ_ERR_ALIASING, "exactly the same buffer", c->ht = A->g_pad + (PAD - 1));
}

static void kda_decode_rows(void)
{
    const op_id op = KDA_DECODE;
    kda_problem_rows(op);
    kda_tensor_rows(op);
    kda_rule_rows(op);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "T = 2", c->kda.T = 2);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "problem->h0 must be NULL", c->kda.h0 = A->h0);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "problem->cu_seqlens must be NULL", c->kda.cu_seqlens = A->cu,
        c->kda.n_seqs = 1);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "output 'state' is NULL", c->state = NULL);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "output 'o' is NULL", c->o = NULL);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "n_state_rows = 0", c->n_state_rows = 0);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "n_state_rows = -1", c->n_state_rows = -1);
    ROW(op, LINSEQ_ERR_SHAPE_MISMATCH, "n_state_rows = 1 < B = 2", c->n_state_rows = 1,
        c->state_rows = NULL);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'state'", c->n_state_rows = (int64_t)1 << 60);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "state_rows[1] = 5", A->rows[1] = POOL_ROWS);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "state_rows[0] = 9223372036854775807",
        A->rows[0] = INT64_MAX);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "names row 3 twice", A->rows[1] = A->rows[0]);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'state_rows'",
        c->state_rows = MISALIGN(const int64_t, A->rows));
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'state'", c->state = MISALIGN(float, A->pool));
    ROW(op, LINSEQ_ERR_ALIASING, "output 'state' overlaps input 'q'", c->kda.q = A->pool + 7);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'o' overlaps input 'state_rows'",
        c->state_rows = (const int64_t *)(void *)A->o);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'state' overlaps output 'o'", c->o = A->pool + 3);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'o' overlaps input 'v'", c->o = A->v);
}

/* The backward's upstream gradients and gradients, for backward_saved (the table's rows
 * cover linseq_kda_backward). */
static void kda_grad_rows(op_id op)
{
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'d_o' is NULL", c->d_o = NULL);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'d_ht'", c->d_ht = MISALIGN(const float, A->d_ht));
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'dk'", c->kda_grads.dk = MISALIGN(float, A->dk));
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dq' overlaps input 'q'", c->kda_grads.dq = A->q);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dq' overlaps input 'd_o'", c->kda_grads.dq = A->d_o + 5);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dv' overlaps input 'v'", c->kda_grads.dv = A->v);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dbeta' overlaps input 'beta'",
        c->kda_grads.dbeta = A->beta + 1);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dg' overlaps input 'g'", c->kda_grads.dg = A->g);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dh0' overlaps input 'h0'", c->kda_grads.dh0 = A->h0);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dh0' overlaps input 'd_ht'", c->kda_grads.dh0 = A->d_ht);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dA_log' overlaps input 'A_log'",
        c->kda_grads.dA_log = A->A_log);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'ddt_bias' overlaps input 'dt_bias'",
        c->kda_grads.ddt_bias = A->dt_bias);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dq' overlaps output 'dk'", c->kda_grads.dk = A->dq);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dv' overlaps output 'dg'", c->kda_grads.dg = A->dv + 2);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dh0' overlaps output 'dA_log'",
        c->kda_grads.dA_log = A->dh0);
}

/* A gradient of what the problem does not have is refused, not left unwritten. */
static void kda_backward_rows(op_id op)
{
    kda_rule_rows(op);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "grads", c->no_grads = true);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "grads->dg is given but decay is LINSEQ_DECAY_NONE",
        c->kda.g = NULL, c->kda.gate_in_kernel = false, c->kda.A_log = c->kda.dt_bias = NULL,
        c->kda_grads.dA_log = c->kda_grads.ddt_bias = NULL, c->kda.decay = LINSEQ_DECAY_NONE);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "grads->dA_log is given but gate_in_kernel is false",
        c->kda.gate_in_kernel = false, c->kda.A_log = c->kda.dt_bias = NULL);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "grads->ddt_bias is given but gate_in_kernel is false",
        c->kda.gate_in_kernel = false, c->kda.A_log = c->kda.dt_bias = NULL,
        c->kda_grads.dA_log = NULL);
}

static void kda_training_rows(void)
{
    op_id op = KDA_SAVED_SIZE;
    kda_problem_rows(op);
    kda_rule_rows(op);
    cu_seqlens_rows(op);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "argument 'bytes' is NULL", c->bytes = NULL);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "saved states", c->kda.T = (int64_t)1 << 60);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "saved states", c->kda.K = c->kda.V = (int64_t)1 << 31);
    /* B large enough to overflow: answered at once, not after a loop over B */
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "saved states", c->kda.B = (int64_t)1 << 60);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "saved states", c->kda.B = INT64_MAX);

    op = KDA_FORWARD_TRAIN;
    kda_problem_rows(op);
    kda_tensor_rows(op);
    kda_output_rows(op);
    kda_forward_rows(op);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "argument 'saved' is NULL", c->saved_out = NULL);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "saved_bytes = 0", c->saved_bytes = 0);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "saved_bytes", c->saved_bytes = saved_need - 4);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'saved'", c->saved_bytes = SIZE_MAX);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'saved'", c->saved_out = MISALIGN(char, A->saved_out));
    ROW(op, LINSEQ_ERR_ALIASING, "output 'o' overlaps output 'saved'", c->saved_out = A->o);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'saved' overlaps input 'q'", c->saved_out = A->q);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'ht' overlaps output 'saved'", c->ht = A->saved_out + 16);

    op = KDA_BACKWARD_SAVED;
    kda_problem_rows(op);
    kda_tensor_rows(op);
    kda_grad_rows(op);
    kda_backward_rows(op);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "argument 'saved' is NULL", c->saved_in = NULL);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "saved_bytes = 10", c->saved_bytes = 10);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "saved_bytes", c->saved_bytes = saved_need - 4);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'saved'", c->saved_bytes = SIZE_MAX);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'saved'", c->saved_in = MISALIGN(const char, A->saved_in));
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "not written by linseq_kda_forward_train", c->saved_in = A->q,
        c->saved_bytes = sizeof A->q);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'saved' was written in chunked mode",
        c->exec.mode = LINSEQ_MODE_RECURRENT);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'saved' was written in chunked mode",
        c->exec.chunk_size = 32);
    ROW(op, LINSEQ_ERR_SHAPE_MISMATCH, "'saved' describes K=8 V=6", c->kda.V = 3);
    ROW(op, LINSEQ_ERR_SHAPE_MISMATCH, "'saved' describes", c->kda.B = 1);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dq' overlaps input 'saved'",
        c->kda_grads.dq = A->saved_in + 20);
}

/* ---------------------------------------------------------------------------------------- */
/* KDA gate                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* The gate's own rules (op_table_rows checks the rest): no "no decay", K required per
 * channel, the lower bound's range, and products of sizes that overflow while each fits. */
static void gate_rows(op_id op)
{
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "decay = 0", c->gate.decay = LINSEQ_DECAY_NONE);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "K = 0", c->gate.K = 0);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "lower_bound = 0.5", c->gate.lower_bound = 0.5f);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "lower_bound = nan", c->gate.lower_bound = NAN);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "lower_bound = -inf", c->gate.lower_bound = -INFINITY);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'g_raw'", c->gate.H = c->gate.K = (int64_t)1 << 32);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'g_raw'", c->gate.decay = LINSEQ_DECAY_PER_HEAD,
        c->gate.B = c->gate.T = c->gate.H = (int64_t)1 << 21);
}

static void gate_backward_rows(void)
{
    const op_id op = GATE_BACKWARD;
    gate_rows(op);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "grads", c->no_grads = true);
}

/* ---------------------------------------------------------------------------------------- */
/* SSM1                                                                                       */
/* ---------------------------------------------------------------------------------------- */

/* SSM1's own rules: G divides D, dt_bias only through softplus, and sizes whose product
 * overflows while each fits. */
static void ssm1_rows(op_id op)
{
    ROW(op, LINSEQ_ERR_SHAPE_MISMATCH, "G = 3 does not divide D = 8", c->ssm.G = 3);
    ROW(op, LINSEQ_ERR_SHAPE_MISMATCH, "G = 16 does not divide D = 8", c->ssm.G = 16);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "dt_bias is given but dt_softplus is false",
        c->ssm.dt_softplus = false, c->ssm_grads.ddt_bias = NULL);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'x'", c->ssm.D = (int64_t)1 << 40,
        c->ssm.T = (int64_t)1 << 30, c->ssm.G = 1);
}

/* A gradient of what the problem does not have is refused, not left unwritten. */
static void ssm1_backward_rows(void)
{
    const op_id op = SSM1_BACKWARD;
    ssm1_rows(op);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "grads is NULL", c->no_grads = true);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "dgate is given but gate is NULL", c->ssm.gate = NULL);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "dD_skip is given but D_skip is NULL", c->ssm.D_skip = NULL);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "ddt_bias is given but dt_softplus is false",
        c->ssm.dt_softplus = false, c->ssm.dt_bias = NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* Causal conv1d                                                                              */
/* ---------------------------------------------------------------------------------------- */

static void conv_forward_rows(void)
{
    const op_id op = CONV_FORWARD;
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'x'", c->conv.T = (int64_t)1 << 40,
        c->conv.D = (int64_t)1 << 30);
    /* W = 2: a one-column state, still only exactly in place */
    ROW(op, LINSEQ_ERR_ALIASING, "output 'conv_state_out' overlaps input 'conv_state'",
        c->conv.W = 2, c->conv_state_out = A->c_state + 1);
}

static void conv_backward_rows(void)
{
    const op_id op = CONV_BACKWARD;
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'x'", c->conv.T = (int64_t)1 << 40,
        c->conv.D = (int64_t)1 << 30);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "grads is NULL", c->no_grads = true);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "dbias is given but bias is NULL", c->conv.bias = NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* Every op of the op table, from its description                                             */
/* ---------------------------------------------------------------------------------------- */
/* The forward and backward of each op in the op table (src/optable), broken in every way
 * its description names: each required tensor NULL, each tensor misaligned, each size 0, -1
 * and too large for a byte count, each enum option out of its range, each output over each
 * input and over each other output, each exec field out of range, and with varlen each
 * spoiled cu_seqlens; and the optional tensors absent, which must be accepted. A new op gets
 * these rows from its table entry; the hand-written rows above keep the op's own rules.
 *
 * A fixture holds every tensor of one valid problem in one block, each in a slot as large as
 * the largest tensor plus a pad (so that an output shifted onto an input by one element, up
 * or down, overlaps that input only); the inputs and upstream gradients first, then the
 * outputs and gradients, poisoned. */

enum { GT_PROBLEM_BYTES = 512, GT_PAD = 16, GT_SIZE_CAP = 8 };

typedef struct gt_fixture {
    const ls_op *op;
    bool varlen;
    _Alignas(max_align_t) unsigned char problem[GT_PROBLEM_BYTES]; /* the valid problem */
    char fn[2][64]; /* the forward's and the backward's function name */
    unsigned char *mem, *pristine, *before;
    size_t bytes, outputs_at;
    float *buf[LS_OP_MAX_TENSORS]; /* by table index; NULL when the tensor does not exist */
    int64_t count[LS_OP_MAX_TENSORS];
    int64_t *cu; /* varlen: n_seqs + 1 offsets, in the block */
} gt_fixture;

/* One call of the forward (out) or the backward (up, grads), as ls_op_backward takes them. */
typedef struct gt_call {
    const gt_fixture *f;
    bool backward, no_problem;
    linseq_exec exec;
    _Alignas(max_align_t) unsigned char problem[GT_PROBLEM_BYTES];
    float *out[LS_OP_MAX_OUT];
    const float *up[LS_OP_MAX_OUT];
    float *grads[LS_OP_MAX_GRADS];
} gt_call;

static int gt_rows_run;

/* The name the library's messages give t: the struct field, or the call argument. */
static const char *gt_name(const ls_tensor_desc *t) { return t->field ? t->field : t->name; }

static bool gt_reads(bool backward, const ls_tensor_desc *t)
{
    return t->role == LS_ROLE_INPUT || (backward && t->role == LS_ROLE_UPSTREAM);
}

static bool gt_writes(bool backward, const ls_tensor_desc *t)
{
    return t->role == (backward ? LS_ROLE_GRAD : LS_ROLE_OUTPUT);
}

static bool gt_uses(bool backward, const ls_tensor_desc *t)
{
    return gt_reads(backward, t) || gt_writes(backward, t);
}

static void gt_set(gt_call *c, const ls_tensor_desc *t, const void *ptr)
{
    const ls_op *op = c->f->op;
    switch (t->role) {
    case LS_ROLE_INPUT: ls_tensor_set(t, c->problem, ptr); break;
    case LS_ROLE_OUTPUT: c->out[t->offset] = (float *)ptr; break;
    case LS_ROLE_UPSTREAM: c->up[t->offset] = ptr; break;
    case LS_ROLE_GRAD:
        for (int i = 0; ls_op_tensor(op, LS_ROLE_GRAD, i); i++)
            if (ls_op_tensor(op, LS_ROLE_GRAD, i) == t) c->grads[i] = (float *)ptr;
        break;
    }
}

static gt_call gt_valid(const gt_fixture *f, bool backward)
{
    gt_call c = {.f = f, .backward = backward};
    memcpy(c.problem, f->problem, sizeof c.problem);
    for (int i = 0; i < f->op->n_tensors; i++)
        if (gt_uses(backward, &f->op->tensors[i]) && f->op->tensors[i].role != LS_ROLE_INPUT)
            gt_set(&c, &f->op->tensors[i], f->buf[i]);
    return c;
}

static linseq_status gt_invoke(const gt_call *c)
{
    const void *p = c->no_problem ? NULL : c->problem;
    return c->backward ? ls_op_backward(c->f->op, p, &c->exec, c->up, c->grads)
                       : c->f->op->forward(p, &c->exec, c->out);
}

/* Runs a broken call: the status, a message naming the function and one of the needles
 * (NULL-terminated), and no byte of the block changed. */
static void gt_row2(const gt_call *c, linseq_status want, linseq_status or_want,
                    const char *const *needles, const char *label)
{
    const gt_fixture *f = c->f;
    const char *fn = f->fn[c->backward];
    rows_run++;
    gt_rows_run++;
    memcpy(f->before, f->mem, f->bytes);
    const int threads_before = linseq_get_num_threads();
    const linseq_status st = gt_invoke(c);
    const char *msg = linseq_last_error();
    bool named = false;
    for (int i = 0; needles[i]; i++) named = named || strstr(msg, needles[i]) != NULL;
    CHECK(st == want || st == or_want, "%s, %s%s: status %s, expected %s (%s)", fn, label,
          f->varlen ? " (varlen)" : "", linseq_status_string(st), linseq_status_string(want), msg);
    CHECK(strstr(msg, fn) != NULL && named, "%s, %s: message \"%s\" does not name \"%s\"%s", fn,
          label, msg, needles[0], needles[1] ? " (or the alternatives)" : "");
    CHECK(tu_is_poisoned(f->mem + f->outputs_at, f->bytes - f->outputs_at),
          "%s, %s: an output byte was written", fn, label);
    CHECK(memcmp(f->before, f->mem, f->bytes) == 0, "%s, %s: a buffer changed", fn, label);
    CHECK(linseq_get_num_threads() == threads_before, "%s, %s: the thread setting changed", fn,
          label);
    memcpy(f->mem, f->pristine, f->bytes);
}

static void gt_row(const gt_call *c, linseq_status want, const char *const *needles,
                   const char *label)
{
    gt_row2(c, want, want, needles, label);
}

/* A row with one needle. */
static void gt_row1(const gt_call *c, linseq_status want, const char *needle, const char *label)
{
    const char *const needles[] = {needle, NULL};
    gt_row(c, want, needles, label);
}

/* A call that must succeed and leave no message; the block is restored after it. */
static bool gt_accept(const gt_call *c, const char *label, bool report)
{
    const linseq_status st = gt_invoke(c);
    const bool ok = st == LINSEQ_OK && linseq_last_error()[0] == '\0';
    if (report)
        CHECK(ok, "%s, %s%s: a valid call gave %s (%s)", c->f->fn[c->backward], label,
              c->f->varlen ? " (varlen)" : "", linseq_status_string(st), linseq_last_error());
    memcpy(c->f->mem, c->f->pristine, c->f->bytes);
    return ok;
}

static const ls_size_desc *gt_size_named(const ls_op *op, const char *name)
{
    for (int s = 0; s < op->n_sizes; s++)
        if (strcmp(op->sizes[s].name, name) == 0) return &op->sizes[s];
    fprintf(stderr, "%s has no size %s\n", op->name, name);
    exit(2);
}

static void gt_fixture_free(gt_fixture *f)
{
    free(f->mem);
    free(f->pristine);
    free(f->before);
    memset(f->buf, 0, sizeof f->buf);
    f->mem = f->pristine = f->before = NULL;
}

/* The block for f->problem's shapes (sizes and options set, varlen flagged): realistic
 * inputs, poisoned outputs, and the problem pointing at its inputs. */
static void gt_fixture_alloc(gt_fixture *f)
{
    const ls_op *op = f->op;
    static const int64_t placeholder[3];
    if (f->varlen) ls_op_set_varlen(op, f->problem, placeholder, 2); /* shapes see N = 2 */
    /* every input present while the shapes are taken: a gradient may exist only with its
     * input (SSM1's dD_skip, conv's dbias) */
    for (int i = 0; i < op->n_tensors; i++)
        if (op->tensors[i].role == LS_ROLE_INPUT)
            ls_tensor_set(&op->tensors[i], f->problem, placeholder);
    int64_t largest = 3; /* the offsets */
    for (int i = 0; i < op->n_tensors; i++) {
        CHECK(ls_tensor_count(&op->tensors[i], f->problem, &f->count[i]), "%s.%s: count", op->name,
              op->tensors[i].name);
        if (f->count[i] > largest) largest = f->count[i];
    }
    for (int i = 0; i < op->n_tensors; i++)
        if (op->tensors[i].role == LS_ROLE_INPUT && f->count[i] == 0)
            ls_tensor_set(&op->tensors[i], f->problem, NULL);
    const size_t slot = (size_t)(largest + GT_PAD + 15) / 16 * 16 * sizeof(float);
    /* a leading slot, so that an output shifted down from the first tensor stays inside */
    size_t at = slot;
    int order[LS_OP_MAX_TENSORS], n = 0;
    for (int pass = 0; pass < 2; pass++) /* read tensors, then written ones */
        for (int i = 0; i < op->n_tensors; i++) {
            const ls_tensor_desc *t = &op->tensors[i];
            const bool written = t->role == LS_ROLE_OUTPUT || t->role == LS_ROLE_GRAD;
            if (f->count[i] > 0 && written == (pass == 1)) order[n++] = i;
        }
    const size_t cu_at = f->varlen ? at : 0;
    if (f->varlen) at += slot;
    size_t offset[LS_OP_MAX_TENSORS];
    f->outputs_at = 0;
    for (int k = 0; k < n; k++) {
        const ls_tensor_desc *t = &op->tensors[order[k]];
        if (!f->outputs_at && (t->role == LS_ROLE_OUTPUT || t->role == LS_ROLE_GRAD))
            f->outputs_at = at;
        offset[k] = at;
        at += slot;
    }
    f->bytes = at;
    f->mem = calloc(1, f->bytes);
    f->pristine = calloc(1, f->bytes);
    f->before = calloc(1, f->bytes);
    if (!f->mem || !f->pristine || !f->before) abort();
    tu_poison(f->mem + f->outputs_at, f->bytes - f->outputs_at);
    for (int k = 0; k < n; k++) {
        const int i = order[k];
        const ls_tensor_desc *t = &op->tensors[i];
        f->buf[i] = (float *)(void *)(f->mem + offset[k]);
        int64_t dims[LS_OP_MAX_DIMS];
        const int nd = t->shape(f->problem, dims);
        if (t->role == LS_ROLE_INPUT || t->role == LS_ROLE_UPSTREAM)
            ls_op_fill(t, f->buf[i], f->count[i], dims, nd, 500u + (uint64_t)i);
        if (t->role == LS_ROLE_INPUT) ls_tensor_set(t, f->problem, f->buf[i]);
    }
    if (f->varlen) {
        const int64_t tokens = ls_size_get(gt_size_named(op, "T"), f->problem);
        f->cu = (int64_t *)(void *)(f->mem + cu_at);
        f->cu[0] = 0, f->cu[1] = tokens / 3, f->cu[2] = tokens;
        ls_op_set_varlen(op, f->problem, f->cu, 2);
    }
    memcpy(f->pristine, f->mem, f->bytes);
}

/* The calls of the op: the forward, and the backward unless the op is forward-only. */
static int gt_n_calls(const ls_op *op) { return op->backward ? 2 : 1; }

/* Every call of the fixture is valid (on one thread: each parallel region costs much more
 * than these small calls when the machine is busy). */
static bool gt_fixture_valid(const gt_fixture *f, bool report)
{
    bool ok = true;
    for (int backward = 0; backward < gt_n_calls(f->op); backward++) {
        gt_call c = gt_valid(f, backward);
        c.exec.threads = 1;
        ok = gt_accept(&c, "the valid call", report) && ok;
    }
    return ok;
}

/* A valid problem of op with every tensor it can have: the benchmark's options and small
 * sizes, then each bool option turned on where the calls stay valid (KDA's gate in the
 * kernel brings A_log and dt_bias, SSM1's dt_softplus its dt_bias). Varlen: one packed row
 * of two sequences. */
static void gt_fixture_make(gt_fixture *f, const ls_op *op, bool varlen)
{
    memset(f, 0, sizeof *f);
    f->op = op;
    f->varlen = varlen;
    CHECK(op->problem_size <= GT_PROBLEM_BYTES, "%s: problem struct too large", op->name);
    const char *entry = op->entry_stem ? op->entry_stem : op->problem_type;
    const size_t stem = op->entry_stem ? strlen(entry) : strlen(entry) - strlen("_problem");
    snprintf(f->fn[0], sizeof f->fn[0], "%.*s_forward", (int)stem, entry);
    snprintf(f->fn[1], sizeof f->fn[1], "%.*s_backward", (int)stem, entry);
    for (int s = 0; s < op->n_sizes; s++) {
        const int64_t d = op->sizes[s].bench_default;
        ls_size_set(&op->sizes[s], f->problem, d < GT_SIZE_CAP ? d : GT_SIZE_CAP);
    }
    if (op->bench_options) op->bench_options(f->problem);
    for (int o = 0; o < op->n_options; o++) {
        const ls_option_desc *opt = &op->options[o];
        if (opt->type != LS_CTYPE_BOOL) continue;
        bool *flag = (bool *)(void *)(f->problem + opt->offset);
        if (*flag) continue;
        *flag = true;
        gt_fixture_alloc(f);
        const bool ok = gt_fixture_valid(f, false);
        gt_fixture_free(f);
        *flag = ok;
    }
    gt_fixture_alloc(f);
}

/* Each required tensor of the call NULL, and each tensor one byte off its alignment. */
static void gt_pointer_rows(const gt_fixture *f, bool backward)
{
    char label[128], needle[96];
    for (int i = 0; i < f->op->n_tensors; i++) {
        const ls_tensor_desc *t = &f->op->tensors[i];
        if (!gt_uses(backward, t) || !f->buf[i]) continue;
        gt_call c = gt_valid(f, backward);
        if (t->required) {
            gt_set(&c, t, NULL);
            snprintf(label, sizeof label, "%s = NULL", gt_name(t));
            snprintf(needle, sizeof needle, "'%s' is NULL", gt_name(t));
            gt_row1(&c, LINSEQ_ERR_NULL_POINTER, needle, label);
        }
        gt_set(&c, t, (const char *)f->buf[i] + 1);
        snprintf(label, sizeof label, "%s misaligned", gt_name(t));
        snprintf(needle, sizeof needle, "'%s'", gt_name(t));
        gt_row1(&c, LINSEQ_ERR_INVALID_VALUE, needle, label);
    }
}

/* A size far beyond memory: some tensor's byte count overflows, and the message names one of
 * those tensors or quotes the value. An optional size refines another (HV of H, G of D), so
 * the rule between them may refuse it first. */
static void gt_overflow_row(const gt_fixture *f, bool backward, const ls_size_desc *s,
                            int64_t value)
{
    gt_call c = gt_valid(f, backward);
    ls_size_set(s, c.problem, value);
    char label[128], text[LS_OP_MAX_TENSORS + 1][48];
    const char *needles[LS_OP_MAX_TENSORS + 2];
    int n = 0;
    snprintf(text[n], sizeof text[n], "%lld", (long long)value);
    needles[n] = text[n];
    n++;
    for (int i = 0; i < f->op->n_tensors; i++) {
        const ls_tensor_desc *t = &f->op->tensors[i];
        int64_t count;
        if (!gt_uses(backward, t) || !f->buf[i]) continue;
        if (ls_tensor_count(t, c.problem, &count) && count <= PTRDIFF_MAX / (int64_t)sizeof(float))
            continue;
        snprintf(text[n], sizeof text[n], "'%s'", gt_name(t));
        needles[n] = text[n];
        n++;
    }
    needles[n] = NULL;
    CHECK(n > 1, "%s: %s = %lld overflows no tensor", f->op->name, s->name, (long long)value);
    snprintf(label, sizeof label, "%s = %lld", s->name, (long long)value);
    gt_row2(&c, LINSEQ_ERR_SIZE_OVERFLOW,
            s->required ? LINSEQ_ERR_SIZE_OVERFLOW : LINSEQ_ERR_SHAPE_MISMATCH, needles, label);
}

/* Each size below its range (0 where it is required, -1 always) and beyond memory. */
static void gt_size_rows(const gt_fixture *f, bool backward)
{
    char label[128];
    for (int s = 0; s < f->op->n_sizes; s++) {
        const ls_size_desc *sd = &f->op->sizes[s];
        for (int64_t value = sd->required ? 0 : -1; value >= -1; value--) {
            gt_call c = gt_valid(f, backward);
            ls_size_set(sd, c.problem, value);
            snprintf(label, sizeof label, "%s = %lld", sd->name, (long long)value);
            gt_row1(&c, LINSEQ_ERR_INVALID_SIZE, label, label);
        }
        gt_overflow_row(f, backward, sd, (int64_t)1 << 62);
        /* INT64_MAX is no multiple of anything: only where no divisibility rule applies */
        if (sd->required) gt_overflow_row(f, backward, sd, INT64_MAX);
    }
}

/* Each enum option one past its names' range on either side. */
static void gt_enum_rows(const gt_fixture *f, bool backward)
{
    char label[128];
    for (int o = 0; o < f->op->n_options; o++) {
        const ls_option_desc *opt = &f->op->options[o];
        bool seen = false; /* two keys may name one field (SSM1's activation) */
        for (int e = 0; e < o; e++) seen = seen || f->op->options[e].offset == opt->offset;
        if (opt->type != LS_CTYPE_ENUM || seen) continue;
        int lo = INT_MAX, hi = INT_MIN;
        for (const ls_enum_name *nm = opt->names; nm->name; nm++) {
            if (nm->value < lo) lo = nm->value;
            if (nm->value > hi) hi = nm->value;
        }
        const int values[2] = {lo > 0 ? -1 : lo - 1, hi + 1};
        for (int v = 0; v < 2; v++) {
            gt_call c = gt_valid(f, backward);
            memcpy(c.problem + opt->offset, &values[v], sizeof values[v]);
            snprintf(label, sizeof label, "%s = %d", opt->field, values[v]);
            gt_row1(&c, LINSEQ_ERR_INVALID_ENUM, label, label);
        }
    }
}

/* Each output one element above and one below each input, and over each later output. */
static void gt_overlap_rows(const gt_fixture *f, bool backward)
{
    char label[160], n1[128], n2[128];
    const ls_op *op = f->op;
    for (int o = 0; o < op->n_tensors; o++) {
        const ls_tensor_desc *ot = &op->tensors[o];
        if (!gt_writes(backward, ot) || !f->buf[o]) continue;
        for (int x = 0; x < op->n_tensors; x++) {
            const ls_tensor_desc *xt = &op->tensors[x];
            if (!f->buf[x] || x == o || !gt_uses(backward, xt)) continue;
            const bool input = gt_reads(backward, xt);
            if (!input && x < o) continue; /* each pair of outputs once */
            snprintf(n1, sizeof n1, "output '%s' overlaps %s '%s'", gt_name(ot),
                     input ? "input" : "output", gt_name(xt));
            snprintf(n2, sizeof n2, "output '%s' overlaps output '%s'", gt_name(xt), gt_name(ot));
            const char *const needles[] = {n1, input ? NULL : n2, NULL};
            for (int shift = -1; shift <= 1; shift += 2) {
                if (!input && shift < 0) continue;
                gt_call c = gt_valid(f, backward);
                gt_set(&c, ot, f->buf[x] + shift);
                snprintf(label, sizeof label, "%s = %s %+d", gt_name(ot), gt_name(xt), shift);
                gt_row(&c, LINSEQ_ERR_ALIASING, needles, label);
            }
        }
        if (f->varlen) {
            gt_call c = gt_valid(f, backward);
            gt_set(&c, ot, f->cu);
            snprintf(label, sizeof label, "%s = cu_seqlens", gt_name(ot));
            snprintf(n1, sizeof n1, "output '%s' overlaps input 'cu_seqlens'", gt_name(ot));
            gt_row1(&c, LINSEQ_ERR_ALIASING, n1, label);
        }
    }
}

/* The offsets of a packed row: B must be 1, n_seqs >= 1, 0 = cu[0] <= ... <= cu[n] = T. */
static void gt_cu_seqlens_rows(const gt_fixture *f, bool backward)
{
    const ls_op *op = f->op;
    const int64_t tokens = f->cu[2];
    char expect_T[64];
    snprintf(expect_T, sizeof expect_T, "expected T = %lld", (long long)tokens);
    /* two rows of half the tokens each, and offsets that fit them: only B is wrong */
    gt_call c = gt_valid(f, backward);
    ls_size_set(gt_size_named(op, "B"), c.problem, 2);
    ls_size_set(gt_size_named(op, "T"), c.problem, tokens / 2);
    f->cu[1] = 1, f->cu[2] = tokens / 2;
    gt_row1(&c, LINSEQ_ERR_SHAPE_MISMATCH, "B must be 1", "B = 2 with cu_seqlens");
    const struct {
        int index;
        int64_t value;
        linseq_status want;
        const char *needle;
    } cu_cases[] = {
        {0, 1, LINSEQ_ERR_INVALID_CU_SEQLENS, "cu_seqlens[0] = 1"},
        {0, -1, LINSEQ_ERR_INVALID_CU_SEQLENS, "cu_seqlens[0] = -1"},
        {1, tokens + 1, LINSEQ_ERR_INVALID_CU_SEQLENS, "decreases at index 2"},
        {2, tokens - 1, LINSEQ_ERR_INVALID_CU_SEQLENS, expect_T},
        {2, tokens + 1, LINSEQ_ERR_INVALID_CU_SEQLENS, expect_T},
    };
    for (size_t k = 0; k < sizeof cu_cases / sizeof cu_cases[0]; k++) {
        c = gt_valid(f, backward);
        f->cu[cu_cases[k].index] = cu_cases[k].value;
        gt_row1(&c, cu_cases[k].want, cu_cases[k].needle, cu_cases[k].needle);
    }
    const struct {
        int64_t n_seqs;
        linseq_status want;
        const char *needle;
    } n_cases[] = {{0, LINSEQ_ERR_INVALID_SIZE, "n_seqs = 0"},
                   {-1, LINSEQ_ERR_INVALID_SIZE, "n_seqs = -1"},
                   {INT64_MAX, LINSEQ_ERR_SIZE_OVERFLOW, "n_seqs"}};
    for (size_t k = 0; k < sizeof n_cases / sizeof n_cases[0]; k++) {
        c = gt_valid(f, backward);
        ls_op_set_varlen(op, c.problem, f->cu, n_cases[k].n_seqs);
        gt_row1(&c, n_cases[k].want, n_cases[k].needle, n_cases[k].needle);
    }
    c = gt_valid(f, backward);
    ls_op_set_varlen(op, c.problem, (const int64_t *)(void *)((char *)f->cu + 1), 2);
    gt_row1(&c, LINSEQ_ERR_INVALID_VALUE, "'cu_seqlens'", "cu_seqlens misaligned");
}

/* What is optional may be absent: each optional input (with its gradient), each optional
 * output and upstream gradient, each gradient, all gradients (on one thread); and the
 * default and an absurd thread count. */
static void gt_accepted_calls(const gt_fixture *f, bool backward)
{
    const ls_op *op = f->op;
    char label[128];
    gt_call all = gt_valid(f, backward);
    gt_accept(&all, "the valid call", true);
    all.exec.threads = INT_MAX;
    gt_accept(&all, "threads = INT_MAX", true);
    for (int i = 0; i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        if (!gt_uses(backward, t) || !f->buf[i] || t->required) continue;
        gt_call c = gt_valid(f, backward);
        c.exec.threads = 1;
        gt_set(&c, t, NULL);
        for (int g = 0; t->role == LS_ROLE_INPUT && ls_op_tensor(op, LS_ROLE_GRAD, g); g++)
            if (strcmp(ls_op_tensor(op, LS_ROLE_GRAD, g)->grad_of, t->name) == 0) c.grads[g] = NULL;
        snprintf(label, sizeof label, "%s = NULL", gt_name(t));
        gt_accept(&c, label, true);
        if (t->role == LS_ROLE_GRAD) gt_set(&all, t, NULL);
    }
    if (backward) gt_accept(&all, "every gradient NULL", true);
    /* an output the table says may be its input's buffer: exactly that buffer, in place */
    for (int i = 0; !backward && i < op->n_tensors; i++) {
        const ls_tensor_desc *t = &op->tensors[i];
        const ls_tensor_desc *in =
            t->alias_of ? ls_op_tensor_named(op, LS_ROLE_INPUT, t->alias_of) : NULL;
        if (!in || !f->buf[i] || !f->buf[in - op->tensors]) continue;
        gt_call c = gt_valid(f, false);
        c.exec.threads = 1;
        gt_set(&c, t, f->buf[in - op->tensors]);
        snprintf(label, sizeof label, "%s = %s (in place)", gt_name(t), gt_name(in));
        gt_accept(&c, label, true);
    }
}

static void gt_op_rows(const gt_fixture *f)
{
    for (int backward = 0; backward < gt_n_calls(f->op); backward++) {
        gt_accepted_calls(f, backward);
        gt_call c = gt_valid(f, backward);
        c.no_problem = true;
        gt_row1(&c, LINSEQ_ERR_NULL_POINTER, "problem", "problem = NULL");
        gt_pointer_rows(f, backward);
        gt_overlap_rows(f, backward);
        if (f->varlen) {
            gt_cu_seqlens_rows(f, backward);
            continue;
        }
        gt_size_rows(f, backward);
        gt_enum_rows(f, backward);
        for (int e = 0; e < N_EXEC_CASES; e++) {
            if (exec_cases[e].exec.dtype == LINSEQ_DTYPE_BF16 && cpu_bf16(f->fn[backward]))
                continue;
            c = gt_valid(f, backward);
            c.exec = exec_cases[e].exec;
            gt_row1(&c, exec_cases[e].want, exec_cases[e].needle, exec_cases[e].needle);
        }
    }
}

static void op_table_rows(void)
{
    int n_ops;
    const ls_op *const *ops = ls_ops(&n_ops);
    for (int i = 0; i < n_ops; i++)
        for (int varlen = 0; varlen <= (int)ops[i]->varlen; varlen++) {
            gt_fixture f;
            gt_fixture_make(&f, ops[i], varlen);
            if (gt_fixture_valid(&f, true)) gt_op_rows(&f);
            gt_fixture_free(&f);
        }
}

/* ---------------------------------------------------------------------------------------- */
/* Per-thread workspace beyond the address space                                             */
/* ---------------------------------------------------------------------------------------- */

/* One token of HV heads with a K x V state: per-thread workspace of about 4 K V bytes,
 * times 1024 threads. The tensors are only addresses, since the call must refuse before it
 * reads any: the inputs overlap one another (allowed), the output lies past them all. */
static void huge_state(call *c, int64_t K_, int64_t V_, int64_t HV_)
{
    const linseq_kda_problem p = {.B = 1, .T = 1, .H = HV_, .HV = HV_, .K = K_, .V = V_};
    c->kda = p;
    c->kda.q = c->kda.k = c->kda.v = c->kda.beta = c->d_o = A->q;
    /* A fake address past the inputs, never dereferenced: the workspace check is a size
     * check, so it refuses the call before the aliasing check would look at o's 16 TB range
     * (which may cover the call's structs or, under valgrind, the inputs). */
    const uintptr_t past_inputs = (uintptr_t)A->q + (uintptr_t)(4 * HV_ * (K_ > V_ ? K_ : V_));
    c->o = (float *)((past_inputs + 63) & ~(uintptr_t)63);
    c->ht = NULL;
    c->d_ht = NULL;
    c->kda_grads = (linseq_kda_grads){0};
    c->exec.threads = 1024;
}

/* 4 K V bytes * 1024 threads wraps a 64-bit size (to 256 KiB for the recurrent forward):
 * refused as too large, never allocated short and written past. */
static void workspace_overflow_rows(void)
{
    const int64_t big_V = ((int64_t)1 << 32) - 6;
    ROW(KDA_FORWARD, LINSEQ_ERR_SIZE_OVERFLOW, "workspace (1024 x",
        huge_state(c, (int64_t)1 << 20, big_V, 1024), c->exec.mode = LINSEQ_MODE_RECURRENT);
    ROW(KDA_FORWARD, LINSEQ_ERR_SIZE_OVERFLOW, "workspace (1024 x",
        huge_state(c, (int64_t)1 << 20, big_V, 1024), c->exec.mode = LINSEQ_MODE_CHUNKED);
    /* the backward's checkpoints (66 states at T = 1) fit; 1024 copies of them do not */
    ROW(KDA_BACKWARD, LINSEQ_ERR_SIZE_OVERFLOW, "workspace (1024 x",
        huge_state(c, (int64_t)1 << 23, (int64_t)1 << 23, 1024),
        c->exec.mode = LINSEQ_MODE_RECURRENT);
}

/* ---------------------------------------------------------------------------------------- */
/* The thread setting, and the valid calls that look like mistakes                           */
/* ---------------------------------------------------------------------------------------- */

static void thread_setting_rows(void)
{
    ROW(SET_THREADS, LINSEQ_ERR_INVALID_VALUE, "n = -1", c->n_threads = -1);
    ROW(SET_THREADS, LINSEQ_ERR_INVALID_VALUE, "n = -2147483648", c->n_threads = INT_MIN);
    CHECK_OK(linseq_set_num_threads(3));
    CHECK(linseq_get_num_threads() == 3, "thread count not kept");
    CHECK_OK(linseq_set_num_threads(0));
    CHECK(linseq_get_num_threads() >= 1, "default thread count < 1");
    CHECK(strcmp(linseq_last_error(), "") == 0, "a success leaves a stale message");
}

/* The allowed aliasing, optional arguments, and sizes far beyond the machine that are still
 * valid requests. Each must succeed and clear the message of the failure before it. */
static void accepted_calls(void)
{
    for (op_id op = 0; op < SET_THREADS; op++) {
        ROW(op, LINSEQ_ERR_INVALID_ENUM, "mode", c->exec.mode = (linseq_mode)7);
        ACCEPT(op);
        ACCEPT(op, c->exec.threads = INT_MAX); /* capped, not an error and not a crash */
        /* every op accepts every valid exec; the training pair needs the forward's exec */
        if (op != KDA_FORWARD_TRAIN && op != KDA_BACKWARD_SAVED)
            ACCEPT(op, c->exec.chunk_size = 16, c->exec.mode = LINSEQ_MODE_RECURRENT);
    }
    /* one wide item: the forward splits its state's columns over the threads */
    ACCEPT(KDA_FORWARD, c->kda.B = c->kda.H = c->kda.HV = 1, c->kda.T = 2, c->kda.V = 40,
           c->exec.threads = INT_MAX);
    ACCEPT(KDA_FORWARD, c->kda.B = c->kda.H = c->kda.HV = 1, c->kda.T = 2, c->kda.V = 40,
           c->exec.threads = INT_MAX, c->exec.mode = LINSEQ_MODE_RECURRENT);
    CHECK_OK(linseq_set_num_threads(INT_MAX));
    ACCEPT(KDA_FORWARD, c->kda.B = c->kda.H = c->kda.HV = 1, c->kda.T = 2, c->kda.V = 40);
    ACCEPT(KDA_FORWARD);
    ACCEPT(SSM1_FORWARD);
    CHECK_OK(linseq_set_num_threads(0));

    /* the outputs that may be the same buffer as their input: the state updated in place */
    ACCEPT(KDA_FORWARD, c->ht = A->h0);
    ACCEPT(KDA_FORWARD_TRAIN, c->ht = A->h0);
    ACCEPT(SSM1_FORWARD, c->hT = A->s_h0);
    ACCEPT(CONV_FORWARD, c->conv_state_out = A->c_state);
    /* inputs may overlap each other: they are only read */
    ACCEPT(KDA_FORWARD, c->kda.k = A->q, c->kda.beta = A->q);
    ACCEPT(KDA_BACKWARD, c->kda.k = A->q, c->d_ht = A->h0);
    ACCEPT(SSM1_FORWARD, c->ssm.C_proj = A->B_proj, c->ssm.gate = A->x);
    ACCEPT(CONV_BACKWARD, c->d_y = A->x);
    /* optional tensors absent; gradients of absent h0 / conv_state / dt_bias allowed */
    ACCEPT(KDA_FORWARD, c->kda.h0 = NULL, c->ht = NULL, c->kda.A_log = c->kda.dt_bias = NULL);
    ACCEPT(KDA_BACKWARD, c->kda.h0 = NULL, c->d_ht = NULL,
           c->kda_grads = (linseq_kda_grads){.dh0 = A->dh0});
    ACCEPT(KDA_BACKWARD, c->kda_grads = (linseq_kda_grads){0});
    ACCEPT(GATE_FORWARD, c->gate.A_log = c->gate.dt_bias = NULL);
    ACCEPT(GATE_FORWARD, c->gate.decay = LINSEQ_DECAY_PER_HEAD, c->gate.K = 0);
    ACCEPT(SSM1_BACKWARD, c->ssm.h0 = NULL, c->ssm.dt_bias = NULL, c->d_hT = NULL);
    ACCEPT(CONV_BACKWARD, c->conv.conv_state = NULL, c->d_conv_state_out = NULL);
    /* W == 1 has no state: the state pointers are ignored */
    ACCEPT(CONV_FORWARD, c->conv.W = 1, c->conv.conv_state = A->weight, c->conv_state_out = A->x);
    /* n_seqs is ignored without cu_seqlens; the saved-size query needs no tensor at all */
    ACCEPT(KDA_FORWARD, c->kda.n_seqs = -7);
    ACCEPT(KDA_SAVED_SIZE, c->kda = (linseq_kda_problem){.B = 3, .T = 9, .H = 1, .K = 4, .V = 2});
    /* a size query beyond any memory is answered, not iterated */
    ACCEPT(KDA_SAVED_SIZE, c->kda.B = (int64_t)1 << 40, c->kda.T = c->kda.K = c->kda.V = 1,
           c->kda.H = c->kda.HV = 1);
    /* decode: padding requests, and the default row mapping */
    ACCEPT(KDA_DECODE, A->rows[0] = -1, A->rows[1] = INT64_MIN);
    ACCEPT(KDA_DECODE, c->state_rows = NULL);
    /* varlen with an empty sequence */
    ACCEPT(SSM1_FORWARD, varlen(c), A->cu[1] = 0);
    ACCEPT(KDA_FORWARD, varlen(c), A->cu[1] = 10);
}

/* ---------------------------------------------------------------------------------------- */

static void fill_arena(void)
{
    tu_rng r = {77};
    A->cu[0] = 0, A->cu[1] = 4, A->cu[2] = 2 * T;
    A->rows[0] = 3, A->rows[1] = 0;
    float *in = (float *)(void *)((char *)A + offsetof(arena, q));
    tu_fill_normal(&r, in, (OUTPUTS_AT - offsetof(arena, q)) / sizeof(float), 0.5);
    for (size_t i = 0; i < sizeof A->beta / sizeof(float); i++) A->beta[i] = 0.5f;
    for (size_t i = 0; i < sizeof A->A / sizeof(float); i++) A->A[i] = -fabsf(A->A[i]);
    tu_poison((char *)A + OUTPUTS_AT, sizeof *A - OUTPUTS_AT);

    /* the saved forward of the valid KDA call, the input of backward_saved */
    const linseq_kda_problem p = valid_kda();
    CHECK_OK(linseq_kda_saved_size(&p, NULL, &saved_need));
    if (saved_need > sizeof A->saved_in) {
        fprintf(stderr, "saved_in holds %zu bytes, the valid problem needs %zu\n",
                sizeof A->saved_in, saved_need);
        exit(2);
    }
    float o[B * T * HV * V];
    CHECK_OK(linseq_kda_forward_train(&p, NULL, o, NULL, A->saved_in, saved_need));
}

int main(void)
{
    /* zeroed: the pads and the struct padding are compared too */
    A = calloc(1, sizeof *A);
    pristine = calloc(1, sizeof *A);
    before = calloc(1, sizeof *A);
    if (!A || !pristine || !before) return 2;
    fill_arena();
    memcpy(pristine, A, sizeof *A);

    /* the valid call of every entry point runs: each row below breaks exactly one thing */
    for (op_id op = 0; op < N_OPS; op++) ACCEPT(op);

    kda_forward_rows(KDA_FORWARD);
    kda_decode_rows();
    kda_backward_rows(KDA_BACKWARD);
    kda_training_rows();
    gate_rows(GATE_FORWARD);
    gate_backward_rows();
    ssm1_rows(SSM1_FORWARD);
    ssm1_backward_rows();
    conv_forward_rows();
    conv_backward_rows();
    workspace_overflow_rows();
    thread_setting_rows();
    accepted_calls();
    const int hand_written = rows_run;
    op_table_rows();
    printf("  %d bad-input rows over %d entry points (%d from the op table)\n", rows_run,
           (int)N_OPS, rows_run - hand_written);

    free(A);
    free(pristine);
    free(before);
    return tu_finish("test_bad_inputs");
}
