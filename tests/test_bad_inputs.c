/* The bad-input table of every public entry point. Each row takes a valid call of one entry
 * point, breaks one argument in one way, and expects
 *   (a) the specific status,
 *   (b) a message from linseq_last_error() that names the function and the argument,
 *   (c) every buffer the call can see unchanged, byte for byte: the outputs (poisoned with a
 *       byte pattern before the call) and the inputs,
 * then the arena is restored for the next row. A second, shorter table lists the unusual
 * calls that are valid (the documented aliasing, optional arguments, absurd thread counts). */
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* KDA: two sequences of 5 tokens (or one varlen row of 10), GVA with 2 value heads per qk
 * head; the SSM1 and conv1d problems share B and T. */
enum { B = 2, T = 5, H = 2, HV = 4, K = 8, V = 6, POOL_ROWS = 5 };
enum { D = 8, N = 4, G = 2, W = 4, SEQS = 2 };
enum { SAVED_FLOATS = 2048, PAD = 16 };

/* Every buffer of every call, in one block so that one memcmp sees any write. Each tensor is
 * followed by a pad, so that an output shifted by one element overlaps only the tensor the
 * row names. The inputs come first; everything from `o` on is an output and poisoned. */
#define BUF(type, name, n) type name[n]; type name##_pad[PAD]
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
#undef BUF

#define OUTPUTS_AT offsetof(arena, o)

static arena *A;        /* the arena the calls see                                     */
static arena *pristine; /* its state before every row: inputs filled, outputs poisoned  */
static arena *before;   /* its state just before the call of the current row           */
static size_t saved_need; /* linseq_kda_saved_size of the valid KDA problem              */

typedef enum {
    KDA_FORWARD, KDA_DECODE, KDA_BACKWARD, KDA_SAVED_SIZE, KDA_FORWARD_TRAIN, KDA_BACKWARD_SAVED,
    GATE_FORWARD, GATE_BACKWARD, SSM1_FORWARD, SSM1_BACKWARD, CONV_FORWARD, CONV_BACKWARD,
    SET_THREADS, N_OPS
} op_id;

static const char *const fn_name[N_OPS] = {
    "linseq_kda_forward", "linseq_kda_decode", "linseq_kda_backward", "linseq_kda_saved_size",
    "linseq_kda_forward_train", "linseq_kda_backward_saved", "linseq_kda_gate_forward",
    "linseq_kda_gate_backward", "linseq_ssm1_forward", "linseq_ssm1_backward",
    "linseq_conv1d_forward", "linseq_conv1d_backward", "linseq_set_num_threads"};

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
    return (linseq_kda_problem){
        .B = B, .T = T, .H = H, .HV = HV, .K = K, .V = V, .q = A->q, .k = A->k, .v = A->v,
        .beta = A->beta, .g = A->g, .h0 = A->h0, .decay = LINSEQ_DECAY_PER_CHANNEL,
        .qk_l2norm = true, .gate_in_kernel = true, .A_log = A->A_log, .dt_bias = A->dt_bias};
}

/* A valid call of op: every optional input and output present, so that each can be broken. */
static call valid_call(op_id op)
{
    call c = {.op = op};
    c.kda = valid_kda();
    c.kda_grads = (linseq_kda_grads){.dq = A->dq, .dk = A->dk, .dv = A->dv, .dbeta = A->dbeta,
                                     .dg = A->dg, .dh0 = A->dh0, .dA_log = A->dA_log,
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

    c.gate = (linseq_kda_gate_problem){.B = B, .T = T, .H = H, .K = K,
                                       .decay = LINSEQ_DECAY_PER_CHANNEL, .g_raw = A->g_raw,
                                       .A_log = A->A_log, .dt_bias = A->dt_bias};
    c.gate_grads = (linseq_kda_gate_grads){.dg_raw = A->dg_raw, .dA_log = A->gate_dA_log,
                                           .ddt_bias = A->gate_ddt_bias};
    c.g = A->gate_g;
    c.d_g = A->d_g;

    c.ssm = (linseq_ssm1_problem){.B = B, .T = T, .D = D, .N = N, .G = G, .x = A->x,
                                  .dt = A->dt, .A = A->A, .B_proj = A->B_proj,
                                  .C_proj = A->C_proj, .D_skip = A->D_skip, .gate = A->gate,
                                  .h0 = A->s_h0, .dt_softplus = true, .dt_bias = A->s_dt_bias};
    c.ssm_grads = (linseq_ssm1_grads){.dx = A->dx, .ddt = A->ddt, .dA = A->dA,
                                      .dB_proj = A->dB_proj, .dC_proj = A->dC_proj,
                                      .dD_skip = A->dD_skip, .dgate = A->dgate, .dh0 = A->s_dh0,
                                      .ddt_bias = A->s_ddt_bias};
    c.y = A->y;
    c.hT = A->hT;
    c.d_y = A->d_y;
    c.d_hT = A->d_hT;

    c.conv = (linseq_conv1d_problem){.B = B, .T = T, .D = D, .W = W, .x = A->x,
                                     .weight = A->weight, .bias = A->bias,
                                     .conv_state = A->c_state, .activation = LINSEQ_ACT_SILU};
    c.conv_grads = (linseq_conv1d_grads){.dx = A->dx, .dweight = A->dweight, .dbias = A->dbias,
                                         .dconv_state = A->dc_state};
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
        return linseq_kda_backward_saved(kp, ex, c->saved_in, c->saved_bytes, c->d_o, c->d_ht,
                                         kg);
    case GATE_FORWARD: return linseq_kda_gate_forward(c->no_problem ? NULL : &c->gate, ex, c->g);
    case GATE_BACKWARD:
        return linseq_kda_gate_backward(c->no_problem ? NULL : &c->gate, ex, c->d_g,
                                        c->no_grads ? NULL : &c->gate_grads);
    case SSM1_FORWARD: return linseq_ssm1_forward(c->no_problem ? NULL : &c->ssm, ex, c->y, c->hT);
    case SSM1_BACKWARD:
        return linseq_ssm1_backward(c->no_problem ? NULL : &c->ssm, ex, c->d_y, c->d_hT,
                                    c->no_grads ? NULL : &c->ssm_grads);
    case CONV_FORWARD:
        return linseq_conv1d_forward(c->no_problem ? NULL : &c->conv, ex, c->y,
                                     c->conv_state_out);
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
    CHECK(st == want, "line %d, %s, %s: status %s, expected %s (%s)", line, fn_name[c->op],
          what, linseq_status_string(st), linseq_status_string(want), msg);
    CHECK(strstr(msg, fn_name[c->op]) != NULL && strstr(msg, needle) != NULL,
          "line %d, %s, %s: message \"%s\" does not name \"%s\"", line, fn_name[c->op], what, msg,
          needle);
    CHECK(tu_is_poisoned((const char *)A + OUTPUTS_AT, sizeof *A - OUTPUTS_AT),
          "line %d, %s, %s: an output byte was written", line, fn_name[c->op], what);
    CHECK(memcmp(before, A, sizeof *A) == 0, "line %d, %s, %s: a buffer changed", line,
          fn_name[c->op], what);
    CHECK(linseq_get_num_threads() == threads_before,
          "line %d, %s, %s: the thread setting changed", line, fn_name[c->op], what);
    memcpy(A, pristine, sizeof *A);
}

/* A row: op, the status and message fragment it must give, then the statements that break a
 * valid call `c` (a call *). The statements are the row's label. */
#define ROW(op_, want_, needle_, ...)                                                        \
    do {                                                                                     \
        call row_ = valid_call(op_);                                                         \
        call *c = &row_;                                                                     \
        (void)c;                                                                             \
        __VA_ARGS__;                                                                         \
        run_row(&row_, #__VA_ARGS__, __LINE__, want_, needle_);                              \
    } while (0)

/* A call that looks wrong but is valid: it must succeed and leave no message. */
#define ACCEPT(op_, ...)                                                                     \
    do {                                                                                     \
        call row_ = valid_call(op_);                                                         \
        call *c = &row_;                                                                     \
        (void)c;                                                                             \
        __VA_ARGS__;                                                                         \
        const linseq_status st_ = invoke(&row_);                                             \
        CHECK(st_ == LINSEQ_OK && linseq_last_error()[0] == '\0',                            \
              "line %d, %s, %s: a valid call gave %s (%s)", __LINE__, fn_name[op_],          \
              #__VA_ARGS__, linseq_status_string(st_), linseq_last_error());                 \
        memcpy(A, pristine, sizeof *A);                                                      \
    } while (0)

/* A pointer one byte past p: misaligned for any element type. */
#define MISALIGN(type, p) ((type *)(void *)((char *)(p) + 1))

/* ---------------------------------------------------------------------------------------- */
/* Rows shared by entry points                                                                */
/* ---------------------------------------------------------------------------------------- */

static void exec_rows(op_id op)
{
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "exec->mode = 3", c->exec.mode = (linseq_mode)3);
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "exec->mode = -1", c->exec.mode = (linseq_mode)-1);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "chunk_size = 48", c->exec.chunk_size = 48);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "chunk_size = 8", c->exec.chunk_size = 8);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "chunk_size = 256", c->exec.chunk_size = 256);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "chunk_size = -64", c->exec.chunk_size = -64);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "threads = -1", c->exec.threads = -1);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "threads", c->exec.threads = INT_MIN);
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "exec->device = 2", c->exec.device = (linseq_device)2);
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "exec->device = -1", c->exec.device = (linseq_device)-1);
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "exec->dtype = 2", c->exec.dtype = (linseq_dtype)2);
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "exec->dtype = -1", c->exec.dtype = (linseq_dtype)-1);
    ROW(op, LINSEQ_ERR_UNSUPPORTED, "LINSEQ_DTYPE_BF16 runs on LINSEQ_DEVICE_CUDA only",
        c->exec.dtype = LINSEQ_DTYPE_BF16);
#ifdef LINSEQ_WITH_CUDA
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "exec->device_index = -1",
        c->exec.device = LINSEQ_DEVICE_CUDA, c->exec.device_index = -1);
#else
    ROW(op, LINSEQ_ERR_UNSUPPORTED, "no CUDA support", c->exec.device = LINSEQ_DEVICE_CUDA);
#endif
}

/* The offsets of a packed row: B must be 1, n_seqs >= 1, 0 = cu[0] <= ... <= cu[n] = T. */
static void cu_seqlens_rows(op_id op)
{
    ROW(op, LINSEQ_ERR_SHAPE_MISMATCH, "B must be 1", varlen(c), c->kda.B = c->ssm.B = c->conv.B = 2,
        c->kda.T = c->ssm.T = c->conv.T = T, A->cu[2] = T);
    ROW(op, LINSEQ_ERR_INVALID_CU_SEQLENS, "cu_seqlens[0] = 1", varlen(c), A->cu[0] = 1);
    ROW(op, LINSEQ_ERR_INVALID_CU_SEQLENS, "cu_seqlens[0] = -1", varlen(c), A->cu[0] = -1);
    ROW(op, LINSEQ_ERR_INVALID_CU_SEQLENS, "decreases at index 2", varlen(c), A->cu[1] = 11);
    ROW(op, LINSEQ_ERR_INVALID_CU_SEQLENS, "expected T = 10", varlen(c), A->cu[2] = 9);
    ROW(op, LINSEQ_ERR_INVALID_CU_SEQLENS, "expected T = 10", varlen(c), A->cu[2] = 11);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "n_seqs = 0", varlen(c), c->kda.n_seqs = c->ssm.n_seqs = c->conv.n_seqs = 0);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "n_seqs = -1", varlen(c), c->kda.n_seqs = c->ssm.n_seqs = c->conv.n_seqs = -1);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "n_seqs", varlen(c),
        c->kda.n_seqs = c->ssm.n_seqs = c->conv.n_seqs = INT64_MAX);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'cu_seqlens'", varlen(c),
        c->kda.cu_seqlens = c->ssm.cu_seqlens = c->conv.cu_seqlens = MISALIGN(const int64_t, A->cu));
}

/* Sizes, enums and options of a KDA problem (every KDA entry point checks them the same way). */
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
    ROW(op, LINSEQ_ERR_SHAPE_MISMATCH, "HV = 3 is not a multiple of H = 2", c->kda.HV = 3);
    ROW(op, LINSEQ_ERR_SHAPE_MISMATCH, "HV = 1 is not a multiple of H = 2", c->kda.HV = 1);
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "decay = 3", c->kda.decay = (linseq_decay)3);
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "decay = -1", c->kda.decay = (linseq_decay)-1);
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
    const char *kv_needle = op == KDA_SAVED_SIZE                                 ? "saved states"
                            : op == KDA_BACKWARD || op == KDA_BACKWARD_SAVED ? "'h0'"
                                                                               : "K*V";
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, kv_needle, c->kda.B = c->kda.H = 1, c->kda.HV = 0,
        c->kda.K = c->kda.V = (int64_t)1 << 31);
    exec_rows(op);
}

/* The tensors of a KDA problem: NULL, misaligned, too large, overlapped by the outputs. */
static void kda_tensor_rows(op_id op)
{
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'q' is NULL", c->kda.q = NULL);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'k' is NULL", c->kda.k = NULL);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'v' is NULL", c->kda.v = NULL);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'beta' is NULL", c->kda.beta = NULL);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'g' is NULL", c->kda.g = NULL);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'q'", c->kda.q = MISALIGN(const float, A->q));
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'dt_bias'", c->kda.dt_bias = MISALIGN(const float, A->dt_bias));
    /* B*T*H*K*4 and HV*K overflow (the latter only exists with the gate in the kernel) */
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'q'", c->kda.B = (int64_t)1 << 62);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'q'", c->kda.B = INT64_MAX);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'g'", c->kda.H = 1, c->kda.HV = c->kda.K = (int64_t)1 << 32);
    if (op != KDA_DECODE) {
        ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'q'", c->kda.T = (int64_t)1 << 60);
        cu_seqlens_rows(op);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* KDA                                                                                        */
/* ---------------------------------------------------------------------------------------- */

static void kda_forward_rows(op_id op)
{
    kda_problem_rows(op);
    kda_tensor_rows(op);
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
    ROW(op, LINSEQ_ERR_ALIASING, "exactly the same buffer", c->ht = A->h0 - 1);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'o' overlaps output 'ht'", c->ht = A->o + 8);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'o' overlaps output 'ht'", c->ht = A->o);
}

static void kda_decode_rows(void)
{
    const op_id op = KDA_DECODE;
    kda_problem_rows(op);
    kda_tensor_rows(op);
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
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "state_rows[0] = 9223372036854775807", A->rows[0] = INT64_MAX);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "names row 3 twice", A->rows[1] = A->rows[0]);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'state_rows'", c->state_rows = MISALIGN(const int64_t, A->rows));
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'state'", c->state = MISALIGN(float, A->pool));
    ROW(op, LINSEQ_ERR_ALIASING, "output 'state' overlaps input 'q'", c->kda.q = A->pool + 7);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'o' overlaps input 'state_rows'",
        c->state_rows = (const int64_t *)(void *)A->o);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'state' overlaps output 'o'", c->o = A->pool + 3);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'o' overlaps input 'v'", c->o = A->v);
}

static void kda_backward_rows(op_id op)
{
    kda_problem_rows(op);
    kda_tensor_rows(op);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "grads", c->no_grads = true);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'d_o' is NULL", c->d_o = NULL);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'d_ht'", c->d_ht = MISALIGN(const float, A->d_ht));
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'dk'", c->kda_grads.dk = MISALIGN(float, A->dk));
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "grads->dg is given but decay is LINSEQ_DECAY_NONE",
        c->kda.g = NULL, c->kda.gate_in_kernel = false, c->kda.A_log = c->kda.dt_bias = NULL,
        c->kda_grads.dA_log = c->kda_grads.ddt_bias = NULL, c->kda.decay = LINSEQ_DECAY_NONE);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "grads->dA_log is given but gate_in_kernel is false",
        c->kda.gate_in_kernel = false, c->kda.A_log = c->kda.dt_bias = NULL);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "grads->ddt_bias is given but gate_in_kernel is false",
        c->kda.gate_in_kernel = false, c->kda.A_log = c->kda.dt_bias = NULL,
        c->kda_grads.dA_log = NULL);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dq' overlaps input 'q'", c->kda_grads.dq = A->q);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dq' overlaps input 'd_o'", c->kda_grads.dq = A->d_o + 5);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dv' overlaps input 'v'", c->kda_grads.dv = A->v);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dbeta' overlaps input 'beta'", c->kda_grads.dbeta = A->beta + 1);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dg' overlaps input 'g'", c->kda_grads.dg = A->g);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dh0' overlaps input 'h0'", c->kda_grads.dh0 = A->h0);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dh0' overlaps input 'd_ht'", c->kda_grads.dh0 = A->d_ht);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dA_log' overlaps input 'A_log'", c->kda_grads.dA_log = A->A_log);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'ddt_bias' overlaps input 'dt_bias'",
        c->kda_grads.ddt_bias = A->dt_bias);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dq' overlaps output 'dk'", c->kda_grads.dk = A->dq);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dv' overlaps output 'dg'", c->kda_grads.dg = A->dv + 2);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dh0' overlaps output 'dA_log'", c->kda_grads.dA_log = A->dh0);
}

static void kda_training_rows(void)
{
    op_id op = KDA_SAVED_SIZE;
    kda_problem_rows(op);
    cu_seqlens_rows(op);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "argument 'bytes' is NULL", c->bytes = NULL);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "saved states", c->kda.T = (int64_t)1 << 60);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "saved states", c->kda.K = c->kda.V = (int64_t)1 << 31);
    /* B large enough to overflow: answered at once, not after a loop over B */
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "saved states", c->kda.B = (int64_t)1 << 60);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "saved states", c->kda.B = INT64_MAX);

    op = KDA_FORWARD_TRAIN;
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
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'saved' was written in chunked mode", c->exec.chunk_size = 32);
    ROW(op, LINSEQ_ERR_SHAPE_MISMATCH, "'saved' describes K=8 V=6", c->kda.V = 3);
    ROW(op, LINSEQ_ERR_SHAPE_MISMATCH, "'saved' describes", c->kda.B = 1);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dq' overlaps input 'saved'", c->kda_grads.dq = A->saved_in + 20);
}

/* ---------------------------------------------------------------------------------------- */
/* KDA gate                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static void gate_rows(op_id op)
{
    ROW(op, LINSEQ_ERR_NULL_POINTER, "problem", c->no_problem = true);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'g_raw' is NULL", c->gate.g_raw = NULL);
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "decay = 0", c->gate.decay = LINSEQ_DECAY_NONE);
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "decay = 5", c->gate.decay = (linseq_decay)5);
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "decay = -1", c->gate.decay = (linseq_decay)-1);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "B = 0", c->gate.B = 0);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "T = -1", c->gate.T = -1);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "H = 0", c->gate.H = 0);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "K = 0", c->gate.K = 0);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "lower_bound = 0.5", c->gate.lower_bound = 0.5f);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "lower_bound = nan", c->gate.lower_bound = NAN);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "lower_bound = -inf", c->gate.lower_bound = -INFINITY);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'A_log'", c->gate.A_log = MISALIGN(const float, A->A_log));
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'g_raw'", c->gate.T = (int64_t)1 << 61);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'g_raw'", c->gate.H = c->gate.K = (int64_t)1 << 32);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'g_raw'", c->gate.decay = LINSEQ_DECAY_PER_HEAD,
        c->gate.B = c->gate.T = c->gate.H = (int64_t)1 << 21);
    exec_rows(op);
}

static void gate_forward_rows(void)
{
    const op_id op = GATE_FORWARD;
    gate_rows(op);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "output 'g' is NULL", c->g = NULL);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'g' overlaps input 'g_raw'", c->g = A->g_raw);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'g' overlaps input 'dt_bias'", c->g = A->dt_bias - 3);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'g' overlaps input 'A_log'", c->gate.A_log = A->gate_g + 10);
}

static void gate_backward_rows(void)
{
    const op_id op = GATE_BACKWARD;
    gate_rows(op);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "grads", c->no_grads = true);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'d_g' is NULL", c->d_g = NULL);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dg_raw' overlaps input 'd_g'", c->gate_grads.dg_raw = A->d_g);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dg_raw' overlaps input 'g_raw'", c->gate_grads.dg_raw = A->g_raw + 1);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dA_log' overlaps input 'A_log'", c->gate_grads.dA_log = A->A_log);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'ddt_bias' overlaps input 'dt_bias'",
        c->gate_grads.ddt_bias = A->dt_bias);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dg_raw' overlaps output 'ddt_bias'",
        c->gate_grads.ddt_bias = A->dg_raw + 4);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'ddt_bias' overlaps output 'dA_log'",
        c->gate_grads.dA_log = A->gate_ddt_bias);
}

/* ---------------------------------------------------------------------------------------- */
/* SSM1                                                                                       */
/* ---------------------------------------------------------------------------------------- */

static void ssm1_rows(op_id op)
{
    ROW(op, LINSEQ_ERR_NULL_POINTER, "problem", c->no_problem = true);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'x' is NULL", c->ssm.x = NULL);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'dt' is NULL", c->ssm.dt = NULL);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'A' is NULL", c->ssm.A = NULL);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'B_proj' is NULL", c->ssm.B_proj = NULL);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'C_proj' is NULL", c->ssm.C_proj = NULL);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "B = 0", c->ssm.B = 0);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "T = 0", c->ssm.T = 0);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "D = -3", c->ssm.D = -3);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "N = 0", c->ssm.N = 0);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "G = -1", c->ssm.G = -1);
    ROW(op, LINSEQ_ERR_SHAPE_MISMATCH, "G = 3 does not divide D = 8", c->ssm.G = 3);
    ROW(op, LINSEQ_ERR_SHAPE_MISMATCH, "G = 16 does not divide D = 8", c->ssm.G = 16);
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "gate_activation = 6", c->ssm.gate_activation = (linseq_activation)6);
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "gate_activation = -1", c->ssm.gate_activation = (linseq_activation)-1);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "dt_bias is given but dt_softplus is false",
        c->ssm.dt_softplus = false, c->ssm_grads.ddt_bias = NULL);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'C_proj'", c->ssm.C_proj = MISALIGN(const float, A->C_proj));
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'x'", c->ssm.D = (int64_t)1 << 40, c->ssm.T = (int64_t)1 << 30,
        c->ssm.G = 1);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'A'", c->ssm.N = (int64_t)1 << 62);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'x'", c->ssm.B = INT64_MAX);
    exec_rows(op);
    cu_seqlens_rows(op);
}

static void ssm1_forward_rows(void)
{
    const op_id op = SSM1_FORWARD;
    ssm1_rows(op);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "output 'y' is NULL", c->y = NULL);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'y' overlaps input 'x'", c->y = A->x);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'y' overlaps input 'x'", c->y = A->x + 3);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'y' overlaps input 'gate'", c->y = A->gate - 2);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'hT' overlaps input 'h0'", c->hT = A->s_h0 + 1);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'hT' overlaps input 'A'", c->hT = A->A);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'y' overlaps output 'hT'", c->hT = A->y);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'y' overlaps input 'cu_seqlens'", varlen(c),
        c->ssm.cu_seqlens = (const int64_t *)(void *)A->y);
}

static void ssm1_backward_rows(void)
{
    const op_id op = SSM1_BACKWARD;
    ssm1_rows(op);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "grads is NULL", c->no_grads = true);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'d_y' is NULL", c->d_y = NULL);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "dgate is given but gate is NULL", c->ssm.gate = NULL);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "dD_skip is given but D_skip is NULL", c->ssm.D_skip = NULL);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "ddt_bias is given but dt_softplus is false",
        c->ssm.dt_softplus = false, c->ssm.dt_bias = NULL);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dx' overlaps input 'x'", c->ssm_grads.dx = A->x);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dx' overlaps input 'd_y'", c->ssm_grads.dx = A->d_y + 3);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dh0' overlaps input 'h0'", c->ssm_grads.dh0 = A->s_h0);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dh0' overlaps input 'd_hT'", c->ssm_grads.dh0 = A->d_hT);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dA' overlaps input 'A'", c->ssm_grads.dA = A->A + 1);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dgate' overlaps input 'gate'", c->ssm_grads.dgate = A->gate);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'ddt_bias' overlaps input 'dt_bias'",
        c->ssm_grads.ddt_bias = A->s_dt_bias);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dB_proj' overlaps output 'dC_proj'",
        c->ssm_grads.dC_proj = A->dB_proj);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dx' overlaps output 'ddt'", c->ssm_grads.ddt = A->dx + 1);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dA' overlaps output 'dh0'", c->ssm_grads.dh0 = A->dA);
}

/* ---------------------------------------------------------------------------------------- */
/* Causal conv1d                                                                              */
/* ---------------------------------------------------------------------------------------- */

static void conv_rows(op_id op)
{
    ROW(op, LINSEQ_ERR_NULL_POINTER, "problem", c->no_problem = true);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'x' is NULL", c->conv.x = NULL);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'weight' is NULL", c->conv.weight = NULL);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "B = 0", c->conv.B = 0);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "T = -1", c->conv.T = -1);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "D = 0", c->conv.D = 0);
    ROW(op, LINSEQ_ERR_INVALID_SIZE, "W = 0", c->conv.W = 0);
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "activation = 6", c->conv.activation = (linseq_activation)6);
    ROW(op, LINSEQ_ERR_INVALID_ENUM, "activation = -1", c->conv.activation = (linseq_activation)-1);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "'weight'", c->conv.weight = MISALIGN(const float, A->weight));
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'x'", c->conv.T = (int64_t)1 << 40, c->conv.D = (int64_t)1 << 30);
    ROW(op, LINSEQ_ERR_SIZE_OVERFLOW, "'weight'", c->conv.W = (int64_t)1 << 62);
    exec_rows(op);
    cu_seqlens_rows(op);
}

static void conv_forward_rows(void)
{
    const op_id op = CONV_FORWARD;
    conv_rows(op);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "output 'y' is NULL", c->y = NULL);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'y' overlaps input 'x'", c->y = A->x);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'y' overlaps input 'weight'", c->y = A->weight + 1);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'conv_state_out' overlaps input 'conv_state'",
        c->conv_state_out = A->c_state + 1);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'y' overlaps output 'conv_state_out'", c->conv_state_out = A->y);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'conv_state_out' overlaps input 'conv_state'", c->conv.W = 2,
        c->conv_state_out = A->c_state + 1);
}

static void conv_backward_rows(void)
{
    const op_id op = CONV_BACKWARD;
    conv_rows(op);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "grads is NULL", c->no_grads = true);
    ROW(op, LINSEQ_ERR_NULL_POINTER, "'d_y' is NULL", c->d_y = NULL);
    ROW(op, LINSEQ_ERR_INVALID_VALUE, "dbias is given but bias is NULL", c->conv.bias = NULL);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dx' overlaps input 'x'", c->conv_grads.dx = A->x);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dx' overlaps input 'd_y'", c->conv_grads.dx = A->d_y + 1);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dweight' overlaps input 'weight'", c->conv_grads.dweight = A->weight);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dconv_state' overlaps input 'conv_state'",
        c->conv_grads.dconv_state = A->c_state);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dconv_state' overlaps input 'd_conv_state_out'",
        c->conv_grads.dconv_state = A->d_c_state_out);
    ROW(op, LINSEQ_ERR_ALIASING, "output 'dweight' overlaps output 'dbias'", c->conv_grads.dbias = A->dweight + 2);
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
    gate_forward_rows();
    gate_backward_rows();
    ssm1_forward_rows();
    ssm1_backward_rows();
    conv_forward_rows();
    conv_backward_rows();
    thread_setting_rows();
    accepted_calls();
    printf("  %d bad-input rows over %d entry points\n", rows_run, (int)N_OPS);

    free(A);
    free(pristine);
    free(before);
    return tu_finish("test_bad_inputs");
}
