/* Internal: what the op descriptions (each family's <op>_op.c) share to write them. */
#ifndef LS_OPTABLE_OP_SHAPES_H
#define LS_OPTABLE_OP_SHAPES_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "core/validate.h" /* ls_mul_sat: a product that saturates, which the count refuses */
#include "optable/optable.h"

#define LS_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* d[0 .. ndim) <- the ndim values that follow; returns ndim (a shape function's result). */
static inline int ls_dims(int64_t *d, int ndim, ...)
{
    va_list ap;
    va_start(ap, ndim);
    for (int i = 0; i < ndim; i++) d[i] = va_arg(ap, int64_t);
    va_end(ap);
    return ndim;
}

/* The names of linseq_activation as meta.json spells them (SSM1's gate, conv's output). */
extern const ls_enum_name ls_activation_names[];

/* The shape of a tensor an op does not have (a segment summary's h0): none. */
static inline int ls_shape_none(const void *p, int64_t *dims)
{
    (void)p, (void)dims;
    return 0;
}

/* The fields of an ls_op that every description fills the same way: from its two struct
 * types and the file's `sizes` and `tensors` arrays; an op with options adds
 * LS_OP_OPTIONS(options) (C has no empty array, so an op without options has none). */
#define LS_OP_STRUCTS(problem, grads)                                                              \
    .problem_type = #problem, .grads_type = #grads, .problem_size = sizeof(problem),               \
    .grads_size = sizeof(grads), .sizes = sizes, .n_sizes = LS_COUNT(sizes), .tensors = tensors,   \
    .n_tensors = LS_COUNT(tensors)
/* A forward-only op (no backward, no grads struct): its problem type and the file's `sizes`
 * and `tensors` arrays. */
#define LS_OP_STRUCTS_FORWARD_ONLY(problem)                                                        \
    .problem_type = #problem, .problem_size = sizeof(problem), .sizes = sizes,                     \
    .n_sizes = LS_COUNT(sizes), .tensors = tensors, .n_tensors = LS_COUNT(tensors)
#define LS_OP_OPTIONS(options_) .options = options_, .n_options = LS_COUNT(options_)
/* The same with the arrays named: an op that shares another's sizes or options (arrays
 * declared with their lengths). */
#define LS_OP_STRUCTS_OF(problem, grads, sizes_, options_, tensors_)                               \
    .problem_type = #problem, .grads_type = #grads, .problem_size = sizeof(problem),               \
    .grads_size = sizeof(grads), .sizes = sizes_, .n_sizes = LS_COUNT(sizes_),                     \
    .options = options_, .n_options = LS_COUNT(options_), .tensors = tensors_,                     \
    .n_tensors = LS_COUNT(tensors_)

/* One tensor of an op file's `tensors` list, the rest of its description (ls_tensor_desc)
 * given by designated initializers. The file names its problem struct P and its grads struct
 * G (typedefs). INPUT and GRAD tensors are fields of those; an OUTPUT or UPSTREAM tensor is
 * the index-th of its role in the call's arguments. */
#define LS_INPUT(name_, field_, ...)                                                               \
    {                                                                                              \
        .name = name_, .role = LS_ROLE_INPUT, .field = #field_, .offset = offsetof(P, field_),     \
        __VA_ARGS__                                                                                \
    }
#define LS_OUTPUT(name_, index, ...)                                                               \
    {                                                                                              \
        .name = name_, .role = LS_ROLE_OUTPUT, .offset = index, __VA_ARGS__                        \
    }
#define LS_UPSTREAM(name_, index, output, ...)                                                     \
    {                                                                                              \
        .name = name_, .role = LS_ROLE_UPSTREAM, .offset = index, .grad_of = output, __VA_ARGS__   \
    }
#define LS_GRAD(name_, field_, input, ...)                                                         \
    {                                                                                              \
        .name = name_, .role = LS_ROLE_GRAD, .field = #field_, .offset = offsetof(G, field_),      \
        .grad_of = input, __VA_ARGS__                                                              \
    }

/* An op with packed sequences: its problem's cu_seqlens and n_seqs. */
#define LS_OP_VARLEN(problem)                                                                      \
    .varlen = true, .cu_seqlens_offset = offsetof(problem, cu_seqlens),                            \
    .n_seqs_offset = offsetof(problem, n_seqs)

#endif
