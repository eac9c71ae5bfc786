/*
 * linseq: linear-time sequence-mixing kernels (KDA / gated delta rule, Mamba1 selective
 * scan, causal depthwise conv1d), exact in float32.
 *
 * The one public header. Every op is described by one "problem" struct (sizes, tensor
 * pointers, options: *what* to compute) and run with an optional linseq_exec (mode, chunk
 * size, threads: *how* to compute it). Forward and backward take the same problem struct.
 *
 * Conventions
 *   - Tensors are dense, C order (row-major), float32, host memory, aligned to their element
 *     (4 bytes; 8 for the int64 ones; `saved` 4). Shapes are given in the comments as
 *     [B,T,H,K] etc.; the last index varies fastest. The exception: SSM1's and conv1d's
 *     per-token inputs may be strided views, and their per-token outputs channel-first
 *     (linseq_strides, `channel_first`). docs/robustness.md lists what the
 *     validation guarantees, the allowed aliasing, and how NaN and Inf propagate.
 *   - Every entry point validates every argument before it writes anything. On error it
 *     returns a status != LINSEQ_OK, leaves every output byte unchanged, and
 *     linseq_last_error() describes the argument at fault and what was expected.
 *   - Zero-initialise a problem struct (`linseq_kda_problem p = {0};`) and set what you need:
 *     every zero field means "absent" or "the default" as documented beside it.
 *   - Workspace is allocated internally (malloc) for a call; allocation failure returns
 *     LINSEQ_ERR_OUT_OF_MEMORY before any output is written. Most of it is freed before the
 *     call returns; the SSM1 forward and backward give their large blocks to a process-wide
 *     cache instead (at most 8 blocks, 256 MiB in all by default), which the next call reuses
 *     rather than fault the pages in again; linseq_workspace_release and
 *     linseq_workspace_set_limit give it back or bound it. No result carries over from one
 *     call to another (a reused block is written before it is read); all entry points are
 *     thread-safe and reentrant. The global settings are the default thread count and the
 *     workspace cache's limit.
 *   - Outputs must not overlap inputs or each other, except where an argument says it may be
 *     the same pointer as an input (in-place state update).
 *   - The structs themselves (problem, grads, exec) must not lie inside an output buffer either
 *     (the kernels read their fields while writing the outputs): such a call is refused with
 *     LINSEQ_ERR_ALIASING, like an output over an input.
 *   - Backward: each op's _backward takes the same problem struct as its _forward, the
 *     upstream gradients of the forward's outputs, and a grads struct of output pointers. A
 *     NULL gradient pointer is not computed; a non-NULL one is overwritten (never accumulated
 *     into). Gradients are those of the float64 math evaluated in float32, with respect to the
 *     inputs as given (raw q and k under qk_l2norm, logits under beta_is_logit, the raw gate
 *     input under gate_in_kernel, dt before softplus under dt_softplus). Parameters shared by
 *     sequences (A_log, dt_bias, A, D_skip, weight, bias) get the sum over the batch.
 *     Memory: no state is stored per token; see README "Backward memory".
 */
#ifndef LINSEQ_H
#define LINSEQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LINSEQ_VERSION_MAJOR 0
#define LINSEQ_VERSION_MINOR 1
#define LINSEQ_VERSION_PATCH 0

#if defined(_WIN32)
#define LINSEQ_API
#else
#define LINSEQ_API __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------------------ */
/* Status and errors                                                                     */
/* ------------------------------------------------------------------------------------ */

typedef enum linseq_status {
    LINSEQ_OK = 0,
    LINSEQ_ERR_NULL_POINTER = 1,       /* a required pointer is NULL */
    LINSEQ_ERR_INVALID_SIZE = 2,       /* a size < 1 (or otherwise out of its range) */
    LINSEQ_ERR_SIZE_OVERFLOW = 3,      /* a tensor's byte size does not fit in size_t */
    LINSEQ_ERR_SHAPE_MISMATCH = 4,     /* sizes inconsistent with each other (HV % H, D % G ...) */
    LINSEQ_ERR_INVALID_CU_SEQLENS = 5, /* cu_seqlens not 0 .. T, or decreasing */
    LINSEQ_ERR_INVALID_ENUM = 6,       /* an enum field holds an unknown value */
    LINSEQ_ERR_INVALID_VALUE = 7,      /* a scalar option out of range (scale, lower_bound ...) */
    LINSEQ_ERR_ALIASING = 8,           /* an output overlaps an input or another output */
    LINSEQ_ERR_UNSUPPORTED = 9,        /* a valid request this build cannot run */
    LINSEQ_ERR_OUT_OF_MEMORY = 10,
    LINSEQ_ERR_DEVICE = 11 /* a CUDA call failed (the message names it) */
} linseq_status;

/* A static string naming the status ("LINSEQ_ERR_NULL_POINTER: required pointer is NULL"). */
LINSEQ_API const char *linseq_status_string(linseq_status status);

/* The message of the last failed call on this thread ("" when none): names the function, the
 * argument and the expected shape or range. Valid until the next linseq call on this thread. */
LINSEQ_API const char *linseq_last_error(void);

/* "MAJOR.MINOR.PATCH" */
LINSEQ_API const char *linseq_version(void);

/* The instruction set the kernels run with: "avx512", "avx2" or "scalar". The best one the
 * CPU supports, or the one the environment variable LINSEQ_ISA names (same names, any case;
 * unset or empty: the best), read once per process. A LINSEQ_ISA that names no instruction
 * set, or one this CPU cannot run, is an error, not ignored: every entry point then returns
 * LINSEQ_ERR_INVALID_VALUE (unknown name) or LINSEQ_ERR_UNSUPPORTED (not on this CPU) with a
 * message naming the variable, its value and the valid ones, and linseq_isa() returns
 * "invalid" with that message in linseq_last_error(). */
LINSEQ_API const char *linseq_isa(void);

/* Every op's structs and tensors as JSON, for bindings in other languages: the size, field
 * names, types and offsets of linseq_exec and of each op's problem and grads structs, the
 * accepted option values, which calls it has (backward, training, decode) and whether
 * exec's mode and chunk size apply ("modes"), and each tensor's role, shape (in the header's
 * letters) and gradient. A static string (NULL only when memory ran out on the first call). */
LINSEQ_API const char *linseq_op_table_json(void);

/* The shape the op named op_name ("kda", "kda_gate", "ssm1", "causal_conv1d": the table's
 * names) gives its tensor `tensor` (the table's tensor names: "q", "o", "d_o", "dq"...) under
 * `problem`, a pointer to that op's problem struct whose sizes and options are set (tensor
 * pointers matter only where presence changes a shape, e.g. SSM1's dD exists with D_skip).
 * Writes the dims and returns the rank: 0 when the tensor does not exist with these options,
 * -1 for an unknown op or tensor, a NULL argument, or sizes whose element count overflows.
 * Nothing is validated beyond that: the entry points do it. */
#define LINSEQ_OP_MAX_DIMS 4
LINSEQ_API int linseq_op_tensor_shape(const char *op_name, const char *tensor, const void *problem,
                                      int64_t dims[LINSEQ_OP_MAX_DIMS]);

/* Every tensor's shape under `problem` in one call, in the order of the op's "tensors" list in
 * linseq_op_table_json: ranks[i] as linseq_op_tensor_shape returns it (0: the tensor does not
 * exist with these options, -1: its element count overflows) and its dims in
 * dims[i * LINSEQ_OP_MAX_DIMS ...]. `capacity` is the length of ranks (dims holds capacity *
 * LINSEQ_OP_MAX_DIMS). Returns the op's tensor count (nothing written when it exceeds
 * capacity), or -1 for an unknown op or a NULL argument. What a binding calls once per call
 * instead of once per tensor. */
LINSEQ_API int linseq_op_shapes(const char *op_name, const void *problem, int capacity, int *ranks,
                                int64_t *dims);

/* ------------------------------------------------------------------------------------ */
/* Execution settings (how to run, never what to compute)                               */
/* ------------------------------------------------------------------------------------ */

typedef enum linseq_mode {
    LINSEQ_MODE_DEFAULT = 0,   /* chunked for KDA */
    LINSEQ_MODE_RECURRENT = 1, /* token by token: the state is updated once per token */
    LINSEQ_MODE_CHUNKED = 2    /* chunk-parallel (WY) form: matrix products inside a chunk */
} linseq_mode;

typedef enum linseq_device {
    LINSEQ_DEVICE_CPU = 0, /* host pointers, the library's own thread pool (pthreads) */
    LINSEQ_DEVICE_CUDA = 1 /* device pointers of exec->device_index, on exec->stream.
                            * Experimental: compiled, not yet run on a GPU (README) */
} linseq_device;

typedef enum linseq_dtype {
    LINSEQ_DTYPE_F32 = 0, /* every tensor float32 */
    LINSEQ_DTYPE_BF16 = 1 /* per-token tensors bfloat16 (CUDA; on the CPU the KDA forward and
                           * decode); see below */
} linseq_dtype;

typedef enum linseq_products {
    LINSEQ_PRODUCTS_F32 = 0, /* float32 operands: the exact products of the float32 math */
    LINSEQ_PRODUCTS_BF16 = 1 /* bfloat16 operands, float32 accumulation; see below */
} linseq_products;

typedef struct linseq_exec {
    linseq_mode mode; /* KDA and SSD; the other ops have a single algorithm */
    int chunk_size;   /* KDA and SSD chunked: 16, 32, 64 or 128; 0 = 64 */
    int threads;      /* > 0: use this many threads (at most one per work item, and at most
                       * 1024); 0 = up to linseq_get_num_threads(), fewer when the call is
                       * too small to share */
    /* Where the tensors live. CUDA: every tensor pointer (cu_seqlens and state_rows too) is
     * device memory of device_index; work is enqueued on stream (a cudaStream_t; NULL = the
     * default stream) and the call returns without waiting for it, except that a call with
     * cu_seqlens or state_rows first copies them to the host to validate them (a stream
     * synchronization). Workspace comes from the device's default memory pool, whose release
     * threshold the first call on a device raises to UINT64_MAX (memory stays pooled across
     * calls; cudaMemPoolTrimTo returns it). A build without CUDA returns
     * LINSEQ_ERR_UNSUPPORTED. */
    linseq_device device;
    int device_index;
    void *stream;
    /* BF16: the per-token tensors (KDA q, k, v, beta, g, o; SSM1 x, dt, B_proj, C_proj, gate,
     * y; conv x, y; the standalone gate's g_raw and g; and the gradients of all of these) are
     * bfloat16; states, parameters and their gradients stay float32, and all arithmetic
     * accumulates in float32. The pointers keep their float types in the structs.
     * On LINSEQ_DEVICE_CPU only linseq_kda_forward, linseq_kda_decode and
     * linseq_conv1d_forward (x and y dense [B,T,D] there) take BF16 (any other call returns
     * LINSEQ_ERR_UNSUPPORTED naming itself and the dtype): their results are those of the
     * float32 call on the same values widened to float32, bit for bit, with o (y) rounded once
     * to nearest even; the state is float32 as always. */
    linseq_dtype dtype;
    /* BF16: a permission to run the products that only the output reads with bfloat16
     * operands and float32 accumulation, faster on CPUs with AVX512-BF16 (vdpbf16ps); F32 (the
     * default) keeps every product in float32. Applies to the CPU's chunked KDA forward
     * (linseq_kda_forward and linseq_kda_forward_train in chunked mode), with either dtype, to
     * the CPU's chunked KDA backward (linseq_kda_backward, linseq_kda_backward_saved), and to
     * the CPU's SSD forward and backward in chunked or default mode (linseq_ssd_forward,
     * linseq_ssd_backward); every other call computes as with F32. In KDA the operands of q S (the chunk-start state read
     * by q), of Aqk Vnew (the in-chunk output) between 16-token blocks and, with one decay per
     * head, of Aqk's q k^T are each rounded once to bf16 after the normalisation and the
     * decay scaling. In SSD those of C B^T (the scores), of C S (the chunk-start state read by
     * C) and of M U (the decayed scores times dt x) between 16-token blocks, M after its
     * decays and U after dt. Everything the state depends on stays float32: the final state
     * (and the training forward's saved block) is bit for bit F32's. In the KDA backward the
     * products that only the per-token gradients read take bf16 operands (dq's and dk's
     * products with the state and its gradient, the score matrices' gradients and their
     * products between 16-token blocks); the chain of the state's gradient stays float32, so
     * dh0 and dv are bit for bit F32's, and dq, dk, dbeta, dg carry the rounding. In the SSD
     * backward likewise (the recomputed C B^T, C S and M U as the forward computes them, dY
     * U^T, dY S, the decayed U dS^T and B dS, and the score products between 16-token
     * blocks): dh0 and dD are bit for bit F32's. Every ISA
     * runs these products with the same arithmetic (without AVX512-BF16, on operands widened
     * back to float32); results do not depend on the thread count. Error against float64
     * (KDA's o within about 2x F32's at K = V = 128, its gradients within 1e-2 of their
     * largest; SSD's y within 2^-7 of the sum of |terms| behind it, its gradients within
     * about 5e-3 of their largest, dA 3e-2): docs/semantics.md. Whether they are faster
     * depends on the CPU: docs/performance.md. */
    linseq_products products;
} linseq_exec;

/* The number of CUDA devices this build can use: 0 without CUDA support or without a GPU. */
LINSEQ_API int linseq_cuda_device_count(void);

/* Default thread count for calls whose linseq_exec is NULL or has threads == 0.
 * n == 0 restores the default (the number of processors the process may run on, from its
 * CPU affinity mask). n < 0 is rejected;
 * a call never starts more than 1024 threads, whatever n is.
 * Results are bitwise identical for every thread count. */
LINSEQ_API linseq_status linseq_set_num_threads(int n);
LINSEQ_API int linseq_get_num_threads(void);

/* The workspace cache. The SSM1 forward and backward keep their large workspace blocks after
 * a call, for the next call to reuse instead of faulting their pages in again: at most 8
 * blocks, 256 MiB in all by default. A block is never kept from a call that failed, and when
 * an allocation fails every kept block is freed and the allocation tried once more, so the
 * cache never makes a call fail that would fit without it.
 * linseq_workspace_release frees every kept block now (e.g. after training, before other
 * work that needs the memory) and returns the bytes freed; later calls fill the cache again.
 * linseq_workspace_set_limit sets the most bytes the cache keeps from now on (0: keep
 * nothing, every call frees its workspace), frees kept blocks beyond it, and returns the
 * previous limit. linseq_workspace_kept_bytes is what the cache holds now. Thread-safe;
 * results never depend on the cache (a reused block is written before it is read). */
LINSEQ_API size_t linseq_workspace_release(void);
LINSEQ_API size_t linseq_workspace_set_limit(size_t bytes);
LINSEQ_API size_t linseq_workspace_kept_bytes(void);

/* Any op of the table by its name, for bindings that drive every op from the table: the same
 * calls as the op's own entry points, with the tensors of a role as an array in the order of
 * that role's tensors in the op's "tensors" list (linseq_op_table_json).
 *   linseq_op_forward   outputs: every "output" tensor (NULL for an optional one not wanted).
 *   linseq_op_decode    one token per request over a pool of states, where the op's entry has
 *                       "decode": problem with T = 1 and no state input; state_rows as in
 *                       linseq_kda_decode; outputs: the "output" tensors but the state's own
 *                       (its slot is ignored).
 *   linseq_op_backward  upstream: every "upstream" tensor; grads: the op's grads struct.
 * An unknown name is LINSEQ_ERR_INVALID_VALUE; a call the op does not have (no decode, no
 * backward) LINSEQ_ERR_UNSUPPORTED; both name the op, and nothing is written. */
LINSEQ_API linseq_status linseq_op_forward(const char *op_name, const void *problem,
                                           const linseq_exec *exec, float *const *outputs);
LINSEQ_API linseq_status linseq_op_decode(const char *op_name, const void *problem,
                                          const linseq_exec *exec, float *state,
                                          int64_t n_state_rows, const int64_t *state_rows,
                                          float *const *outputs);
LINSEQ_API linseq_status linseq_op_backward(const char *op_name, const void *problem,
                                            const linseq_exec *exec, const float *const *upstream,
                                            const void *grads);

/* ------------------------------------------------------------------------------------ */
/* State pools as serving engines hold them                                              */
/* ------------------------------------------------------------------------------------ */
/*
 * A decode step over a pool laid out as a serving engine keeps it (vLLM's caches, for one):
 * rows some elements apart (pages of which the state is one part), int32 or int64 slot
 * indices, a padding index of the engine's choosing, the new state written to another slot
 * than the one read (speculative decoding, prefix caching), and bfloat16 or half states.
 * The step reads the state of each request widened to float32, computes in float32 exactly as
 * linseq_op_decode, and writes each new state once, rounded to the pool's type (to nearest
 * even). Against a float32 pool the error of a half-precision one is that rounding, once per
 * step: 2^-9 (bf16) or 2^-12 (f16) relative per element, accumulated over the steps.
 *
 * Request b is padding when src_rows[b] is negative, or equals pad_value with has_pad_value:
 * its outputs are 0 and no row is read or written (its dst_rows entry is not read). Every
 * other request reads row src_rows[b] and writes row dst_rows[b] (its own row without
 * dst_rows), both in [0, n_rows). Every source row is read before any row is written, so a
 * request may write the row another one reads; two requests may read the same row, but not
 * write the same one. Everything (indices, strides, the op's own checks) is checked before the
 * first write: a refused call leaves every row of the pool as it was.
 *
 * Speed: KDA / Gated DeltaNet and SSD read each request's row and write its destination where
 * they lie (a bf16 row is read and written at its own size), unless a request writes a row
 * another request reads; every other case is gathered into a float32 block first and written
 * back after the step.
 */
typedef enum linseq_pool_dtype {
    LINSEQ_POOL_F32 = 0,
    LINSEQ_POOL_BF16 = 1,
    LINSEQ_POOL_F16 = 2 /* IEEE binary16 */
} linseq_pool_dtype;

typedef struct linseq_state_pool {
    void *data;         /* row r starts at element r * row_stride */
    int64_t n_rows;     /* rows an index may name */
    int64_t row_stride; /* elements from one row to the next, >= the state's; 0: the state's */
    linseq_pool_dtype dtype;
    const void *src_rows; /* [B] int32 or int64: the row request b reads; NULL: row b */
    const void *dst_rows; /* [B]: the row it writes; NULL: the row it reads */
    int index_bits;       /* 32 or 64 (0: 64) */
    bool has_pad_value;   /* src_rows[b] == pad_value marks padding too (e.g. a null block 0) */
    int64_t pad_value;
} linseq_state_pool;

/* linseq_state_pool.row_stride of a pool held as a strided array [n_rows, d1, .., dk] (sizes
 * and strides in elements, as PyTorch and NumPy describe tensors, n_dims >= 1): each row must
 * be C-contiguous (a dimension of size 1 may have any stride), as the library reads a state,
 * and rows at least a row apart (vLLM's pages: rows within a larger page). *row_stride gets
 * strides[0], or the row's size when n_rows is 1; a pool laid out otherwise is refused with a
 * message naming the dimension (the caller then copies the rows, or declines). */
LINSEQ_API linseq_status linseq_state_pool_row_stride(int n_dims, const int64_t *sizes,
                                                      const int64_t *strides, int64_t *row_stride);

/* One token per request for the op named op_name (its entry has "decode"), over `pool`: the
 * problem and outputs as linseq_op_decode's. CPU only. */
LINSEQ_API linseq_status linseq_op_decode_pool(const char *op_name, const void *problem,
                                               const linseq_exec *exec,
                                               const linseq_state_pool *pool,
                                               float *const *outputs);

/* Several tokens per request (speculative decoding), as T decode steps of the op named op_name
 * in one call: the problem has T >= 1 tokens per request, its per-token tensors [B,T,...]
 * dense (channel_first and strided views are refused), outputs likewise. Request b starts
 * from row src_rows[b] and the state after its token t goes to row dst_rows[b*T + t]
 * (dst_rows [B,T]); without dst_rows only the state after the last token is kept, in the
 * request's own row. A serving engine that accepted n of the previous call's tokens resumes
 * from the row that token's state went to (vLLM: its slot table's entry n - 1), which rolls
 * the state, and the conv's window, back to the last accepted token. Nothing is written to
 * the pool unless every step succeeds. CPU only. */
LINSEQ_API linseq_status linseq_op_decode_tokens_pool(const char *op_name, const void *problem,
                                                      const linseq_exec *exec,
                                                      const linseq_state_pool *pool,
                                                      float *const *outputs);

/* A prefill (forward) of the op named op_name (its entry has "decode") whose sequences' states
 * live in `pool`: sequence s (a batch row, or a packed sequence with cu_seqlens) starts from
 * row src_rows[s] where has_initial_state[s] (NULL: everywhere), from zeros otherwise, and
 * its final state is written to row dst_rows[s] (its source row without dst_rows); a padding
 * sequence starts from zeros and its final state is not kept. The problem's initial state
 * must be NULL; outputs as linseq_op_forward's, the final state's slot ignored. CPU only. */
LINSEQ_API linseq_status linseq_op_forward_pool(const char *op_name, const void *problem,
                                                const linseq_exec *exec,
                                                const linseq_state_pool *pool,
                                                const bool *has_initial_state,
                                                float *const *outputs);

/* A prefill as linseq_op_forward_pool that also keeps, for prefix caching, the state at each
 * block boundary of each sequence. The tokens are numbered from the start of each sequence's
 * prompt: sequence s's first token here is token computed_tokens[s] (the tokens computed by
 * earlier calls; NULL: 0 for every sequence), and block j holds tokens j * block_size to
 * (j + 1) * block_size - 1 (block_size >= 1). For every boundary P = (j + 1) * block_size strictly inside this call's
 * tokens (computed_tokens[s] < P < computed_tokens[s] + its length), the state after token
 * P - 1 goes to pool row block_rows[s * max_blocks + j] (block_rows [n_seqs, max_blocks], of
 * the pool's index type, as computed_tokens); a negative entry or the pool's pad value keeps
 * no state there. The final state goes to dst_rows[s] as linseq_op_forward_pool's, a padding
 * sequence keeps none, and no row is written twice in a call (a final state on a boundary is
 * the final state's alone). Refused, with nothing written: block_size < 1, max_blocks < 0,
 * a boundary's column j >= max_blocks, a row out of range, a negative computed_tokens,
 * channel_first or strided inputs (the tokens must be dense [B,T,...] or packed [1,T,...]).
 *
 * Each sequence runs piece by piece, a piece ending at each boundary and each starting from
 * the state the previous one ended in; the state at a boundary is bitwise the final state of
 * a forward from the previous boundary's state over that block. Where the op computes token
 * by token (the recurrent forms) that is bitwise the forward over the whole prefix; a chunked
 * form restarts its chunks at each boundary, a rounding-level difference. Nothing is written
 * to the pool unless every piece succeeds; the outputs are those of the pieces. CPU only.
 *
 * vLLM's prefix caching (mamba_block_size, a state_indices_tensor [n_seqs, max_blocks] of
 * int32 cache blocks) maps as: block_rows = state_indices_tensor, max_blocks = its row
 * length, block_size = mamba_block_size, computed_tokens = num_computed_tokens,
 * src_rows[s] = state_indices_tensor[s, initial_state_idx[s]] (the block of the last
 * computed token), dst_rows[s] = state_indices_tensor[s, block_idx_last_scheduled_token[s]],
 * has_initial_state[s] = num_computed_tokens[s] > 0; the columns written are
 * block_idx_first_scheduled_token[s] up to, not including, block_idx_last_scheduled_token[s]. */
LINSEQ_API linseq_status linseq_op_forward_pool_blocks(
    const char *op_name, const void *problem, const linseq_exec *exec,
    const linseq_state_pool *pool, const bool *has_initial_state, int64_t block_size,
    const void *block_rows, int64_t max_blocks, const void *computed_tokens, float *const *outputs);

/* ------------------------------------------------------------------------------------ */
/* Shared enums                                                                          */
/* ------------------------------------------------------------------------------------ */

typedef enum linseq_decay {
    LINSEQ_DECAY_NONE = 0,       /* no decay (g is NULL): plain delta rule */
    LINSEQ_DECAY_PER_HEAD = 1,   /* g [B,T,HV]: one log-decay per token and head */
    LINSEQ_DECAY_PER_CHANNEL = 2 /* g [B,T,HV,K]: one log-decay per key channel (KDA) */
} linseq_decay;

typedef enum linseq_activation {
    LINSEQ_ACT_DEFAULT = 0,   /* the op's default: silu for the SSM1 gate, identity for conv */
    LINSEQ_ACT_IDENTITY = 1,  /* f(z) = z */
    LINSEQ_ACT_SILU = 2,      /* f(z) = z * sigmoid(z) */
    LINSEQ_ACT_SIGMOID = 3,   /* f(z) = 1 / (1 + exp(-z)) */
    LINSEQ_ACT_GELU_TANH = 4, /* f(z) = 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))) */
    LINSEQ_ACT_RELU = 5       /* f(z) = max(z, 0) */
} linseq_activation;

/* ------------------------------------------------------------------------------------ */
/* KDA: gated delta rule with per-channel (Kimi Delta Attention) or per-head decay        */
/* ------------------------------------------------------------------------------------ */
/*
 * Per (sequence, value head), with S a K x V state, for t = 0 .. T-1:
 *     q_t, k_t  <- q_t / sqrt(|q_t|^2 + eps), likewise k_t       (if qk_l2norm; eps =
 *                                                                l2norm_eps, 0: 1e-6)
 *     q_t       <- scale * q_t
 *     S   <- diag(exp(g_t)) S               decay first (per head: exp(g_t) * S)
 *     u_t <- beta_t (v_t - S^T k_t)         delta against the decayed state
 *     S   <- S + k_t u_t^T                  rank-1 write
 *     o_t <- S^T q_t                        read the updated state
 * S starts from h0 (or zeros); ht is S after the last token.
 * Without beta (NULL) there is no delta rule: u_t <- v_t, so S <- diag(exp(g_t)) S + k_t v_t^T
 * and o_t <- S^T q_t: gated linear attention (fla's GLA with a per-channel decay, simple GLA
 * with a per-head one, plain linear attention without decay), on the same kernels, CPU only.
 * beta_is_logit is then unused, grads->dbeta must be NULL, and the segment summaries
 * refuse it.
 *
 * Layouts (HV value heads; q and k have H heads, HV = G*H, value head hv reads qk head hv/G):
 *     q, k      [B,T,H,K]
 *     v, o      [B,T,HV,V]
 *     beta      [B,T,HV]        probabilities, or logits when beta_is_logit; NULL: no delta
 *     g         [B,T,HV,K] (PER_CHANNEL) or [B,T,HV] (PER_HEAD); log decay, <= 0 expected.
 *               With gate_in_kernel, g holds the raw gate input and the decay is
 *               -exp(A_log[hv]) * softplus(g + dt_bias)          (lower_bound == 0), or
 *               lower_bound * sigmoid(exp(A_log[hv]) * (g + dt_bias)) (lower_bound < 0).
 *     h0, ht    [N,HV,K,V] (default) or [N,HV,V,K] (state_v_first); N = B, or the number of
 *               sequences with cu_seqlens.
 * Varlen: with cu_seqlens (int64, n_seqs + 1 entries, 0 = cu[0] <= cu[1] <= ... = T) and
 * B == 1, the time axis packs n_seqs independent sequences; sequence n is tokens
 * cu[n] .. cu[n+1]-1 and uses state row n.
 *
 * Chunked mode is exact for every g <= 0, down to -inf: no exponent it evaluates is
 * positive. A positive g (e^g > 1: a growth, typically a raw gate passed where the log decay
 * belongs) is outside the contract: the kernels notice it in their pass over g and the call
 * returns LINSEQ_ERR_INVALID_VALUE naming 'g'. It is found while computing (checking first
 * would cost a pass over g), so unlike the other refusals the outputs, ht even when it is h0,
 * and a training forward's `saved` then hold undefined values (the backward refuses that
 * block). linseq_kda_decode checks its one token's g first (a pass over 1/V of the state it
 * updates) and writes nothing on that refusal, so a pool keeps its states. NaN is not refused: it propagates (docs/robustness.md). Per-token log decays below -110 are raised to -110 first, which changes nothing in
 * float32 (exp(-110) already rounds to zero in any product with factors <= 1) and keeps the
 * in-chunk cumulative sums small enough to subtract exactly.
 */
typedef struct linseq_kda_problem {
    int64_t B, T; /* batch, tokens per batch row (total packed tokens with cu_seqlens) */
    int64_t H;    /* query/key heads */
    int64_t HV;   /* value heads, a multiple of H; 0 = H */
    int64_t K, V; /* key and value head dims, any >= 1 */

    const int64_t *cu_seqlens; /* NULL, or n_seqs + 1 offsets (varlen; requires B == 1) */
    int64_t n_seqs;

    const float *q, *k, *v, *beta;
    const float *g;  /* see decay; NULL iff decay == LINSEQ_DECAY_NONE */
    const float *h0; /* NULL: start from zeros */

    linseq_decay decay;
    float scale;        /* 0 = K^-0.5; any finite non-zero value otherwise */
    bool qk_l2norm;     /* normalise q and k over K in the kernel (eps inside the sqrt) */
    bool beta_is_logit; /* beta holds logits; the kernel applies a sigmoid */
    bool state_v_first; /* h0/ht are [.,V,K] instead of [.,K,V] */

    bool gate_in_kernel;  /* g is the raw gate input; the decay is computed in the kernel */
    const float *A_log;   /* [HV]; NULL = zeros (exp(A_log) = 1) */
    const float *dt_bias; /* [HV*K] per channel, [HV] per head; NULL = zeros */
    float lower_bound;    /* 0: default gate; < 0: lower-bound gate */
    float l2norm_eps;     /* of qk_l2norm: 0 = 1e-6 (fla's); vLLM's kernels use 1e-5 */
} linseq_kda_problem;

/* o [B,T,HV,V] (required); ht NULL or the state layout. ht may be the same pointer as h0
 * (the state is updated in place); any other overlap with an input is rejected. */
LINSEQ_API linseq_status linseq_kda_forward(const linseq_kda_problem *problem,
                                            const linseq_exec *exec, float *o, float *ht);

/* Single-step decode for a batch of requests: T must be 1, B is the number of requests, and
 * each request's state lives in a pool of n_state_rows rows ([n_state_rows,HV,K,V] or V-first),
 * updated in place. state_rows (int64 [B], optional) maps request b to its row; NULL means row
 * b (then n_state_rows >= B). A negative row marks a padding request: its o row is set to 0
 * and no state is touched. Two requests may not share a row. problem->h0 and cu_seqlens must
 * be NULL. Rows not named are never read or written. */
LINSEQ_API linseq_status linseq_kda_decode(const linseq_kda_problem *problem,
                                           const linseq_exec *exec, float *state,
                                           int64_t n_state_rows, const int64_t *state_rows,
                                           float *o);

typedef struct linseq_kda_grads {
    float *dq, *dk;  /* [B,T,H,K]; summed over the value heads of each group (GVA) */
    float *dv;       /* [B,T,HV,V] */
    float *dbeta;    /* [B,T,HV]: w.r.t. beta as given (the logits with beta_is_logit) */
    float *dg;       /* shape of g: w.r.t. g as given (the raw gate input when in kernel) */
    float *dh0;      /* state layout; allowed without h0 (the gradient at a zero state) */
    float *dA_log;   /* [HV], gate_in_kernel only */
    float *ddt_bias; /* [HV*K] or [HV], gate_in_kernel only */
} linseq_kda_grads;

/* The gradients of L = sum(o * d_o) + sum(ht * d_ht). d_o [B,T,HV,V] is required; d_ht (state
 * layout) may be NULL. Recurrent mode checkpoints the state every chunk_size tokens and
 * recomputes inside a segment; chunked mode keeps one state per chunk. Both are exact for
 * every g <= 0 and give the same gradients to float32 rounding. */
LINSEQ_API linseq_status linseq_kda_backward(const linseq_kda_problem *problem,
                                             const linseq_exec *exec, const float *d_o,
                                             const float *d_ht, const linseq_kda_grads *grads);

/* Training without recomputation. linseq_kda_backward runs the forward again to get the state
 * at every chunk start; a training step that calls forward and backward can instead keep
 * those from its forward: linseq_kda_forward_train is linseq_kda_forward that also writes
 * `saved` (the state before every chunk, or every chunk_size tokens in recurrent mode, and in
 * chunked mode every token's delta: per sequence and value head ceil(L/C) K V + L V floats,
 * never one state per token), and linseq_kda_backward_saved uses it. Pass the same problem
 * and exec to the three calls; a header in `saved` checks mode, chunk size, sizes, the
 * options that shape the states and the sequence lengths of cu_seqlens (another cu_seqlens of
 * the same sizes is LINSEQ_ERR_INVALID_VALUE).
 * linseq_kda_saved_size reads only the sizes and cu_seqlens of the problem. */
LINSEQ_API linseq_status linseq_kda_saved_size(const linseq_kda_problem *problem,
                                               const linseq_exec *exec, size_t *bytes);
LINSEQ_API linseq_status linseq_kda_forward_train(const linseq_kda_problem *problem,
                                                  const linseq_exec *exec, float *o, float *ht,
                                                  void *saved, size_t saved_bytes);
LINSEQ_API linseq_status linseq_kda_backward_saved(const linseq_kda_problem *problem,
                                                   const linseq_exec *exec, const void *saved,
                                                   size_t saved_bytes, const float *d_o,
                                                   const float *d_ht,
                                                   const linseq_kda_grads *grads);

/* Segment summary, for splitting one sequence across processes (context parallelism): a
 * segment of tokens maps the state it starts from affinely, S_end = P S_start + R, per
 * (sequence, value head), with
 *     P = (I - b_L k_L k_L^T) D_L ... (I - b_1 k_1 k_1^T) D_1    [K,K], D_t = diag(exp(g_t))
 *     R = the end state from zeros                              (the state layout)
 * (k, b = beta and g after the in-kernel options). K-major: S_end[i,:] = sum_j P[i,j]
 * S_start[j,:]; V-first states: S_end = S_start P^T. P is [N,HV,K,K]; R may be NULL (not
 * written). The problem is the forward's with h0 NULL; the chunked form runs whatever
 * exec->mode (chunk_size applies), exact for every g <= 0 as the forward. CPU, float32 only.
 * Conv1d needs no summary (a piece's end state is its last W-1 inputs). */
LINSEQ_API linseq_status linseq_kda_segment_forward(const linseq_kda_problem *problem,
                                                    const linseq_exec *exec, float *P, float *R);

/* The gradients of L = sum(P * d_P) + sum(R * d_R) (d_P, d_R: NULL = zeros). dq is zero (q
 * does not enter); grads->dh0 must be NULL. Runs the KDA backward once over V+K value
 * columns (values [v | 0] from the state [0 | I]): about (V+K)/V of linseq_kda_backward, with
 * three [B,T,HV,V+K] buffers allocated for the call. */
LINSEQ_API linseq_status linseq_kda_segment_backward(const linseq_kda_problem *problem,
                                                     const linseq_exec *exec, const float *d_P,
                                                     const float *d_R,
                                                     const linseq_kda_grads *grads);

/* ------------------------------------------------------------------------------------ */
/* KDA gate (standalone): the decay of a KDA layer from its raw gate input               */
/* ------------------------------------------------------------------------------------ */
/*     default:      g = -exp(A_log[h]) * softplus(g_raw + dt_bias)
 *     lower bound:  g = lower_bound * sigmoid(exp(A_log[h]) * (g_raw + dt_bias))
 * PER_CHANNEL: g_raw, g [B,T,H,K], dt_bias [H*K]. PER_HEAD: g_raw, g [B,T,H], dt_bias [H].
 * softplus(x) = log(1 + e^x), returning x for x > 20 (as torch and fla do). */
typedef struct linseq_kda_gate_problem {
    int64_t B, T, H, K; /* K is ignored (may be 0) for PER_HEAD */
    linseq_decay decay; /* PER_HEAD or PER_CHANNEL */
    const float *g_raw;
    const float *A_log;   /* [H]; NULL = zeros */
    const float *dt_bias; /* NULL = zeros */
    float lower_bound;    /* 0: default form; < 0: lower-bound form */
} linseq_kda_gate_problem;

LINSEQ_API linseq_status linseq_kda_gate_forward(const linseq_kda_gate_problem *problem,
                                                 const linseq_exec *exec, float *g);

typedef struct linseq_kda_gate_grads {
    float *dg_raw;   /* shape of g_raw */
    float *dA_log;   /* [H] */
    float *ddt_bias; /* [H*K] or [H] */
} linseq_kda_gate_grads;

/* The gradients of L = sum(g * d_g); d_g has the shape of g. */
LINSEQ_API linseq_status linseq_kda_gate_backward(const linseq_kda_gate_problem *problem,
                                                  const linseq_exec *exec, const float *d_g,
                                                  const linseq_kda_gate_grads *grads);

/* Element strides (in elements, not bytes) of a per-token input of SSM1 or conv1d: see
 * "Other layouts" below. All zero: dense in the problem's layout. */
typedef struct linseq_strides {
    int64_t batch, token;
    int64_t channel; /* x, dt, gate: between channels; B_proj, C_proj: between groups */
    int64_t state;   /* B_proj, C_proj: between states; 0 for the others */
} linseq_strides;

/* ------------------------------------------------------------------------------------ */
/* SSM1: Mamba1 selective state space scan (real A)                                       */
/* ------------------------------------------------------------------------------------ */
/* Per sequence, channel d (group gi = d / (D/G)) and state n:
 *     dt_t      = dt_softplus ? softplus(dt_t + dt_bias[d]) : dt_t    (threshold 20)
 *     h_t[d,n]  = exp(A[d,n] dt_t[d]) h_{t-1}[d,n] + dt_t[d] B_t[gi,n] x_t[d]
 *     y_t[d]    = sum_n h_t[d,n] C_t[gi,n] + D[d] x_t[d]
 *     y_t[d]   *= act(gate_t[d])                                       (if gate)
 * Layouts: x, dt, gate, y [B,T,D]; A [D,N]; B_proj, C_proj [B,T,G,N]; D_skip, dt_bias [D];
 * h0, hT [N_seq,D,N] (N_seq = B, or n_seqs with cu_seqlens). hT is the state after the last
 * token, before any gate.
 *
 * Other layouts (mamba-ssm's [batch, dim, seqlen], views into larger tensors):
 *   - channel_first: y, d_y, dx, ddt, dgate are dense [B,D,T] and dB_proj, dC_proj dense
 *     [B,G,N,T] instead; the per-token inputs default to these layouts too.
 *   - The per-token inputs (x, dt, gate, B_proj, C_proj) may each carry element strides
 *     (linseq_strides): element (b, t, d) of x is x[b*batch + t*token + d*channel], element
 *     (b, t, g, n) of B_proj is B_proj[b*batch + t*token + g*channel + n*state]. All four zero
 *     (the default) means dense in the problem's layout. Strides are >= 0; a zero stride
 *     repeats the same elements (broadcast: mamba's constant B [D,N] is G = D groups with
 *     batch = token = 0, channel = N, state = 1). x, dt and gate must leave `state` 0. With
 *     cu_seqlens (B == 1) t is the packed token index. The memory an input may be read from
 *     is everything between its pointer and its last reachable element; an output must not
 *     overlap that span. */
typedef struct linseq_ssm1_problem {
    int64_t B, T, D, N;
    int64_t G;                 /* groups of B_proj / C_proj, dividing D; 0 = 1 */
    const int64_t *cu_seqlens; /* NULL, or n_seqs + 1 offsets (requires B == 1) */
    int64_t n_seqs;

    const float *x, *dt, *A;
    const float *B_proj, *C_proj; /* the input-dependent B_t and C_t */
    const float *D_skip;          /* NULL: no skip term */
    const float *gate;            /* NULL: no gating */
    const float *h0;              /* NULL: zeros */

    bool dt_softplus;     /* apply softplus(dt + dt_bias) in the kernel */
    const float *dt_bias; /* [D]; NULL = zeros. Only with dt_softplus (else rejected) */
    linseq_activation gate_activation; /* DEFAULT = silu */

    bool channel_first; /* per-token outputs and gradients [B,D,T] / [B,G,N,T] (see above) */
    linseq_strides x_strides, dt_strides, gate_strides; /* all zero: dense */
    linseq_strides B_strides, C_strides;                /* channel = the group stride */
} linseq_ssm1_problem;

/* y [B,T,D] ([B,D,T] with channel_first; required); hT NULL or [N_seq,D,N], may be the same
 * pointer as h0. */
LINSEQ_API linseq_status linseq_ssm1_forward(const linseq_ssm1_problem *problem,
                                             const linseq_exec *exec, float *y, float *hT);

typedef struct linseq_ssm1_grads {
    float *dx;       /* [B,T,D] ([B,D,T] with channel_first, as every per-token gradient) */
    float *ddt;      /* [B,T,D]: w.r.t. dt as given (before softplus with dt_softplus) */
    float *dA;       /* [D,N], summed over the batch */
    float *dB_proj;  /* [B,T,G,N] ([B,G,N,T]), summed over the channels of each group */
    float *dC_proj;  /* [B,T,G,N] ([B,G,N,T]) */
    float *dD_skip;  /* [D], only with D_skip */
    float *dgate;    /* [B,T,D], only with gate */
    float *dh0;      /* [N_seq,D,N]; allowed without h0 (the gradient at a zero state) */
    float *ddt_bias; /* [D], only with dt_softplus */
} linseq_ssm1_grads;

/* The gradients of L = sum(y * d_y) + sum(hT * d_hT). d_y [B,T,D] (the layout of y) is
 * required, d_hT [N_seq,D,N] may be NULL. The state is checkpointed every 64 tokens and
 * recomputed inside a segment. */
LINSEQ_API linseq_status linseq_ssm1_backward(const linseq_ssm1_problem *problem,
                                              const linseq_exec *exec, const float *d_y,
                                              const float *d_hT, const linseq_ssm1_grads *grads);

/* Training without the checkpoint pass, as linseq_kda_forward_train: linseq_ssm1_backward
 * first runs the recurrence again to get the state before every 64-token segment; a training
 * step that calls forward and backward can instead keep those from its forward.
 * linseq_ssm1_forward_train is linseq_ssm1_forward (the same y and hT) that also writes `saved`
 * (per sequence of L tokens ceil(L/64) D N floats, never one state per token, plus a small
 * header), and linseq_ssm1_backward_saved reads it: the gradients of linseq_ssm1_backward,
 * bit for bit. Pass the same problem, inputs and exec to the three calls; a header in `saved`
 * checks the sizes, options and sequence lengths of cu_seqlens it was written for. h0 is not read again, so hT may overwrite it
 * in between. linseq_ssm1_saved_size reads only the sizes and cu_seqlens of the problem. CPU
 * only (a CUDA exec returns LINSEQ_ERR_UNSUPPORTED). */
LINSEQ_API linseq_status linseq_ssm1_saved_size(const linseq_ssm1_problem *problem,
                                                const linseq_exec *exec, size_t *bytes);
LINSEQ_API linseq_status linseq_ssm1_forward_train(const linseq_ssm1_problem *problem,
                                                   const linseq_exec *exec, float *y, float *hT,
                                                   void *saved, size_t saved_bytes);
LINSEQ_API linseq_status linseq_ssm1_backward_saved(const linseq_ssm1_problem *problem,
                                                    const linseq_exec *exec, const void *saved,
                                                    size_t saved_bytes, const float *d_y,
                                                    const float *d_hT,
                                                    const linseq_ssm1_grads *grads);

/* Single-step decode for a batch of requests, as linseq_kda_decode: T must be 1, B is the
 * number of requests, and request b's state is row state_rows[b] (int64 [B]; NULL: row b, then
 * n_state_rows >= B) of a pool [n_state_rows,D,N], updated in place. A negative row marks a
 * padding request: its y row is set to 0 and no state is touched. Two requests may not share a
 * row. problem->h0 and cu_seqlens must be NULL; strides and channel_first apply as in the
 * forward (with T = 1 both layouts of y are [B,D]). Rows not named are never read or
 * written. Each request gets the bits of a one-token linseq_ssm1_forward from its row. CPU
 * only (a CUDA exec returns LINSEQ_ERR_UNSUPPORTED). */
LINSEQ_API linseq_status linseq_ssm1_decode(const linseq_ssm1_problem *problem,
                                            const linseq_exec *exec, float *state,
                                            int64_t n_state_rows, const int64_t *state_rows,
                                            float *y);

/* Segment summary (context parallelism, as linseq_kda_segment_forward): the map is diagonal,
 * h_end = P * h_start + R elementwise, per sequence, channel d and state n:
 *     P = exp(A[d,n] * sum_t dt_t[d])   (dt after softplus(dt + dt_bias) with dt_softplus)
 *     R = the end state from zeros
 * P, R [N_seq,D,N]; R may be NULL. The problem is the forward's with h0 NULL (the gate, D_skip
 * and C_proj do not enter). CPU, float32 only. */
LINSEQ_API linseq_status linseq_ssm1_segment_forward(const linseq_ssm1_problem *problem,
                                                     const linseq_exec *exec, float *P, float *R);

/* The gradients of L = sum(P * d_P) + sum(R * d_R) (d_P, d_R [N_seq,D,N]: NULL = zeros); dC_proj,
 * dD_skip and dgate are zero, grads->dh0 must be NULL. */
LINSEQ_API linseq_status linseq_ssm1_segment_backward(const linseq_ssm1_problem *problem,
                                                      const linseq_exec *exec, const float *d_P,
                                                      const float *d_R,
                                                      const linseq_ssm1_grads *grads);

/* ------------------------------------------------------------------------------------ */
/* Causal depthwise conv1d (Mamba's short conv)                                           */
/* ------------------------------------------------------------------------------------ */
/*     xs = concat_time(conv_state or zeros [D,W-1], x^T)            per sequence
 *     y[t,d] = act(bias[d] + sum_{j<W} weight[d,j] xs[d,t+j])      weight[d,W-1] hits x_t
 *     conv_state_out = the last W-1 columns of xs                   (zero-padded on the left)
 * Layouts: x, y [B,T,D]; weight [D,W]; bias [D]; conv_state, conv_state_out [N_seq,D,W-1],
 * oldest input first (N_seq = B, or n_seqs with cu_seqlens). With state_tap_major every conv
 * state (conv_state, conv_state_out, dconv_state, d_conv_state_out, and the rows of a decode
 * pool, [n_state_rows,state_len,D] then) is [N_seq,W-1,D]: the D channels of one position
 * contiguous, as vLLM keeps its conv states; the values are the same, only their order
 * differs. With weight_tap_major, weight and dweight are [W,D]: a tap's D weights contiguous,
 * as a serving engine packs them once (weight transposed), so that a decode step reads them
 * as vectors instead of transposing [D,W] on every call. (The CUDA backend takes the default
 * layouts only.)
 * Other layouts, as SSM1's: channel_first makes y, d_y and dx dense [B,D,T] (causal-conv1d's
 * layout), and x may carry element strides (x_strides: batch, token, channel; state 0; all
 * zero = dense in the problem's layout). */
typedef struct linseq_conv1d_problem {
    int64_t B, T, D, W;
    const int64_t *cu_seqlens; /* NULL, or n_seqs + 1 offsets (requires B == 1) */
    int64_t n_seqs;
    const float *x, *weight;
    const float *bias;            /* NULL: no bias */
    const float *conv_state;      /* NULL: zeros */
    linseq_activation activation; /* DEFAULT = identity */
    bool channel_first;           /* y, d_y, dx [B,D,T] */
    linseq_strides x_strides;     /* all zero: dense */
    bool state_tap_major;         /* conv states [N_seq,W-1,D] instead of [N_seq,D,W-1] */
    bool weight_tap_major;        /* weight, dweight [W,D] instead of [D,W] */
} linseq_conv1d_problem;

/* y [B,T,D] (required); conv_state_out NULL or [N_seq,D,W-1], may be the same pointer as
 * conv_state (decode: the window is advanced in place). */
LINSEQ_API linseq_status linseq_conv1d_forward(const linseq_conv1d_problem *problem,
                                               const linseq_exec *exec, float *y,
                                               float *conv_state_out);

typedef struct linseq_conv1d_grads {
    float *dx;          /* [B,T,D] */
    float *dweight;     /* [D,W], summed over the batch */
    float *dbias;       /* [D], only with bias */
    float *dconv_state; /* [N_seq,D,W-1]; allowed without conv_state (gradient at zeros) */
} linseq_conv1d_grads;

/* The gradients of L = sum(y * d_y) + sum(conv_state_out * d_conv_state_out). d_y [B,T,D] is
 * required; d_conv_state_out [N_seq,D,W-1] may be NULL (it carries the gradient of the next
 * segment when a long sequence is processed in pieces). */
LINSEQ_API linseq_status linseq_conv1d_backward(const linseq_conv1d_problem *problem,
                                                const linseq_exec *exec, const float *d_y,
                                                const float *d_conv_state_out,
                                                const linseq_conv1d_grads *grads);

/* causal-conv1d's update step for a batch of requests, over a pool of conv states.
 * problem: B requests of T >= 1 new tokens each (x [B,T,D], or [B,D,T] with channel_first,
 * strides allowed), weight, bias and activation as the forward; conv_state and cu_seqlens must
 * be NULL. state: a pool [n_state_rows, D, state_len] ([n_state_rows, state_len, D] with
 * state_tap_major; state_len >= W-1 and >= 1), updated in
 * place; state_rows (int64 [B], optional) maps request b to its row (NULL: row b, then
 * n_state_rows >= B); a negative row is a padding request: its y rows are 0 and no state is
 * touched; two requests may not share a row. Rows not named are never read or written.
 * Without cache_seqlens a row is a shift register: the last state_len inputs of its sequence,
 * oldest first. The new tokens see the row's last W-1 entries as the inputs before them; then
 * the row moves left by T and the T inputs are appended (with T >= state_len only the newest
 * state_len inputs remain).
 * With cache_seqlens (int64 [B], each >= 0) a row is a circular buffer: with
 * c = cache_seqlens[b] % state_len, the inputs before the new tokens are the entries at
 * positions (c - (W-1) + i) mod state_len, i = 0 .. W-2 (oldest first), read before anything
 * is written; then token i is written at position (c + i) % state_len, in token order (a later
 * token overwrites an earlier one when T > state_len). cache_seqlens itself is not updated.
 * y [B,T,D] ([B,D,T] with channel_first) is the forward's output for that window: bias, the
 * taps and the activation give the same bits as linseq_conv1d_forward with conv_state set to
 * the W-1 previous inputs. No backward (as in causal-conv1d). CPU only. */
LINSEQ_API linseq_status linseq_conv1d_decode(const linseq_conv1d_problem *problem,
                                              const linseq_exec *exec, float *state,
                                              int64_t n_state_rows, int64_t state_len,
                                              const int64_t *state_rows,
                                              const int64_t *cache_seqlens, float *y);

/* ------------------------------------------------------------------------------------ */
/* EMA: per-channel exponential moving average (the template op: forward and decode)      */
/* ------------------------------------------------------------------------------------ */

/* Per sequence b and channel d, from s = h0[b,d] (0 without h0), for t = 0 .. T-1:
 *     s = a[d] * s + (1 - a[d]) * x[b,t,d],    y[b,t,d] = s
 * a [D] is a decay in [0, 1] (a value outside it or NaN is LINSEQ_ERR_INVALID_VALUE, naming
 * the index). x and y dense [B,T,D]; float32 only on the CPU (the CPU is its only device). */
typedef struct linseq_ema_problem {
    int64_t B, T, D;
    const float *x;  /* [B,T,D] */
    const float *a;  /* [D], each in [0, 1] */
    const float *h0; /* [B,D]; NULL: zeros */
} linseq_ema_problem;

/* y [B,T,D] (required); hT NULL or [B,D], the state after the last token, may be the same
 * pointer as h0 (updated in place). No backward. */
LINSEQ_API linseq_status linseq_ema_forward(const linseq_ema_problem *problem,
                                            const linseq_exec *exec, float *y, float *hT);

/* One token for each of B requests, as linseq_ssm1_decode: T must be 1 and h0 NULL; request
 * b's state is row state_rows[b] (int64 [B]; NULL: row b, then n_state_rows >= B) of a pool
 * [n_state_rows, D], updated in place. A negative row is a padding request: its y row is set
 * to 0 and no state is touched. Two requests may not share a row; rows not named are never
 * read or written. Each request gets the bits of a one-token linseq_ema_forward from its row. */
LINSEQ_API linseq_status linseq_ema_decode(const linseq_ema_problem *problem,
                                           const linseq_exec *exec, float *state,
                                           int64_t n_state_rows, const int64_t *state_rows,
                                           float *y);

/* ------------------------------------------------------------------------------------ */
/* SSD: Mamba2's state space duality (a scalar decay per head, no delta rule)            */
/* ------------------------------------------------------------------------------------ */

/* Per sequence and head h (of H), with a state S [P,N] from h0 (zeros when NULL):
 *     dt_t = dt[t,h] (+ dt_bias[h], then softplus, with dt_softplus), clamped to
 *            [dt_min, dt_max] when dt_max > dt_min (mamba's dt_limit; both 0: no clamp)
 *     S_t  = exp(dt_t A[h]) S_{t-1} + dt_t x_t B_t^T      x_t [P], B_t [N] of h's group
 *     y_t  = S_t C_t + D x_t,  then y_t *= silu(z_t) with z
 * The groups share B and C: head h reads group h / (H / G); G divides H (0 = 1).
 * exec->mode: RECURRENT updates the state token by token; DEFAULT and CHUNKED take chunks of
 * exec->chunk_size tokens (0 = 64), with the products inside a chunk as matrix products (the
 * same values within float32 rounding). Results are bitwise identical for every thread count in either mode. */
typedef struct linseq_ssd_problem {
    int64_t B, T, H, P, N;
    int64_t G;                 /* groups of B_proj / C_proj, dividing H; 0 = 1 */
    const int64_t *cu_seqlens; /* NULL, or n_seqs + 1 offsets (requires B == 1) */
    int64_t n_seqs;

    const float *x;               /* [B,T,H,P] */
    const float *dt;              /* [B,T,H] */
    const float *A;               /* [H], each <= 0 (mamba's -exp(A_log)) */
    const float *B_proj, *C_proj; /* [B,T,G,N] */
    const float *D_skip;          /* NULL, [H], or [H,P] with D_per_channel */
    const float *z;               /* NULL, or [B,T,H,P]: the output gate */
    const float *h0;              /* NULL (zeros), or [N_seq,H,P,N] ([N_seq,H,N,P] N-first) */
    const float *dt_bias;         /* [H]; NULL = zeros. Only with dt_softplus (else rejected) */

    bool dt_softplus;   /* dt = softplus(dt + dt_bias) in the kernel */
    bool D_per_channel; /* D_skip is [H,P] (one skip weight per head channel) */
    bool state_n_first; /* h0, hT and a decode pool's rows are [H,N,P] */
    float dt_min, dt_max;
} linseq_ssd_problem;

/* y [B,T,H,P] (required); hT NULL or [N_seq,H,P,N] ([N_seq,H,N,P] N-first), the state after
 * each sequence's last token (h0's row, or zeros, for an empty one), never gated; it may be
 * the same pointer as h0 (updated in place). */
LINSEQ_API linseq_status linseq_ssd_forward(const linseq_ssd_problem *problem,
                                            const linseq_exec *exec, float *y, float *hT);

typedef struct linseq_ssd_grads {
    float *dx;       /* [B,T,H,P] */
    float *ddt;      /* [B,T,H]: w.r.t. dt as given (before dt_bias and softplus) */
    float *dA;       /* [H], summed over the batch */
    float *dB_proj;  /* [B,T,G,N], summed over the heads of each group */
    float *dC_proj;  /* [B,T,G,N] */
    float *dD_skip;  /* the shape of D_skip, only with it */
    float *dz;       /* [B,T,H,P], only with z */
    float *dh0;      /* the shape of h0; allowed without h0 (the gradient at a zero state) */
    float *ddt_bias; /* [H], only with dt_softplus */
} linseq_ssd_grads;

/* The gradients of L = sum(y * d_y) + sum(hT * d_hT), each pointer NULL when not wanted.
 * d_y [B,T,H,P] is required, d_hT (the shape of hT) may be NULL. A clamped dt (dt_max >
 * dt_min) passes no gradient where the clamp holds it. Either mode runs the chunked form
 * backward (exec->chunk_size tokens a chunk): each (sequence, head) recomputes its state
 * before every chunk from h0 and keeps those (ceil(L / chunk) P N floats per thread, L the
 * longest sequence), so memory does not grow with the batch. */
LINSEQ_API linseq_status linseq_ssd_backward(const linseq_ssd_problem *problem,
                                             const linseq_exec *exec, const float *d_y,
                                             const float *d_hT, const linseq_ssd_grads *grads);

/* One token for each of B requests over a pool [n_state_rows,H,P,N] ([..,H,N,P] N-first), as
 * linseq_ema_decode: T must be 1, h0 and cu_seqlens NULL; request b's state is row
 * state_rows[b] (NULL: row b), updated in place; a negative row is a padding request (y row
 * 0, no state touched); two requests may not share a row. Each request gets the bits of a
 * one-token recurrent linseq_ssd_forward from its row. */
LINSEQ_API linseq_status linseq_ssd_decode(const linseq_ssd_problem *problem,
                                           const linseq_exec *exec, float *state,
                                           int64_t n_state_rows, const int64_t *state_rows,
                                           float *y);

/* Segment summary (context parallelism, as linseq_kda_segment_forward): per sequence and head
 * h the map is a scalar times the state, S_end = P S_start + R, with
 *     P = exp(A[h] * sum_t dt_t)   (dt_t as the forward takes it: + dt_bias, softplus, clamp)
 *     R = the end state from zeros (the problem's state layout)
 * P [N_seq,H]; R NULL or [N_seq,H,P,N] ([N_seq,H,N,P] state_n_first). The problem is the
 * forward's with h0 NULL (C_proj, D_skip and z do not enter); exec->mode as the forward's, no
 * output is computed. CPU, float32 only. */
LINSEQ_API linseq_status linseq_ssd_segment_forward(const linseq_ssd_problem *problem,
                                                    const linseq_exec *exec, float *P, float *R);

/* The gradients of L = sum(P * d_P) + sum(R * d_R) (d_P [N_seq,H], d_R the shape of R: NULL =
 * zeros); dC_proj, dD_skip and dz are zero, grads->dh0 must be NULL. Runs linseq_ssd_backward
 * once with no gradient on y, with a [B,T,H,P] buffer of zeros allocated for the call. */
LINSEQ_API linseq_status linseq_ssd_segment_backward(const linseq_ssd_problem *problem,
                                                     const linseq_exec *exec, const float *d_P,
                                                     const float *d_R,
                                                     const linseq_ssd_grads *grads);

#ifdef __cplusplus
}
#endif
#endif /* LINSEQ_H */
