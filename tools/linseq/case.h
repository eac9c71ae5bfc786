/* A reference case folder (meta.json plus one .npy file per tensor), loaded into the
 * problem struct of its op and run through the public API.
 *
 * The library trusts the sizes in a problem struct, so the loader is the memory-safety
 * boundary: every input file must have exactly the dtype and the shape that meta.json's
 * sizes imply before any pointer reaches the library. */
#ifndef LS_TOOLS_CASE_H
#define LS_TOOLS_CASE_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "linseq.h"
#include "npy.h"

#define CASE_MAX_TENSORS 16
#define CASE_NAME_LEN 48

typedef struct case_tensor {
    char name[CASE_NAME_LEN]; /* file name without ".npy" */
    npy_array arr;
} case_tensor;

/* An output or a gradient the op produces, with the shape the sizes imply. */
typedef struct case_output {
    char name[CASE_NAME_LEN];
    const char *dims; /* the shape in meta.json's letters, "[B,T,H,K]", for messages */
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
    int slot; /* gradients: the op's own index of the field in its grads struct */
} case_output;

typedef struct ls_case {
    char *dir;        /* as given on the command line */
    const char *name; /* last component of dir */
    cJSON *meta;
    const struct ls_op *op; /* its description in the op table */
    const char *op_name;
    void *problem; /* the op's problem struct, pointing into inputs[].arr.data */

    int n_inputs; /* every file read: the inputs, then the upstream gradients */
    case_tensor inputs[CASE_MAX_TENSORS];
    int n_produced; /* every output the op computes, listed in meta.json or not */
    case_output produced[CASE_MAX_TENSORS];
    int n_outputs; /* meta.json "outputs", in its order: indices into produced[] */
    int outputs[CASE_MAX_TENSORS];
    /* The gradients of the op's outputs, from meta.json "upstream_grads", by the backward's
     * argument (the table's upstream tensors in order: d_o then d_ht, ...); NULL when not
     * given. Those the table marks required are given when "grads" lists anything. */
    const float *upstream[CASE_MAX_TENSORS];
    int n_computable; /* every gradient the backward computes with these options */
    case_output computable[CASE_MAX_TENSORS];
    int n_grads; /* meta.json "grads", in its order: indices into computable[] */
    int grads[CASE_MAX_TENSORS];
} ls_case;

/* Tensors computed by case_run (t: one per produced[] entry, in that order) and by
 * case_run_backward (g: one per meta.json "grads" entry, in that order). */
typedef struct case_result {
    int n;
    case_tensor t[CASE_MAX_TENSORS];
    int n_grads;
    case_tensor g[CASE_MAX_TENSORS];
} case_result;

/* Loads and validates DIR/meta.json, every input and every upstream gradient it lists. On
 * failure returns false with a one-line message naming the file (and the key or the shapes)
 * in err, and leaves *c empty (case_free is still safe). */
bool case_load(const char *dir, ls_case *c, char *err, size_t err_size);
void case_free(ls_case *c);

/* Runs the op's forward into a zeroed *r. Returns LS_EXIT_OK, LS_EXIT_FAIL when the
 * library returned an error (err holds its status and linseq_last_error()), or
 * LS_EXIT_ERROR when memory ran out; *r is empty on failure. The exec's mode and chunk size
 * reach KDA only. */
int case_run(const ls_case *c, const linseq_exec *exec, case_result *r, char *err, size_t err_size);

/* Runs the op's backward with the same problem and the case's upstream gradients, adding
 * meta.json's "grads" to r (after case_run, or to a zeroed r). Only the listed gradients
 * are computed; the op gets NULL for the others. Same return values as case_run; on
 * failure r's gradients are freed and its outputs kept. Does nothing when "grads" is empty. */
int case_run_backward(const ls_case *c, const linseq_exec *exec, case_result *r, char *err,
                      size_t err_size);
void case_result_free(case_result *r);

/* The computed tensor for output i of meta.json's list. */
const case_tensor *case_output_tensor(const ls_case *c, const case_result *r, int i);

/* Writes meta.json's outputs, then the gradients r holds (if any), as OUT_DIR/<name>.npy,
 * creating OUT_DIR (and its parents) if missing. The set is replaced as a whole: every file
 * is written under a temporary name first, then all are renamed into place; on any failure
 * OUT_DIR keeps exactly the files it held before (an earlier run's complete set stays). With
 * no gradients in r, earlier files of meta.json's "grads" are withdrawn, so that no mix of
 * two runs is left. Refuses an OUT_DIR that is the case folder itself. */
bool case_write_outputs(const ls_case *c, const case_result *r, const char *out_dir, char *err,
                        size_t err_size);

/* What an exec resolves to, for messages: "chunked, chunk 64, 2 threads", or only
 * "2 threads" when the mode does not apply (with_mode false). */
void case_exec_text(const linseq_exec *exec, bool with_mode, char *buf, size_t n);
/* Its mode alone: "recurrent" or "chunked, chunk 64". */
void case_mode_text(const linseq_exec *exec, char *buf, size_t n);
/* The ops of the table whose cases the mode and chunk size apply to: "kda and kda_segment";
 * "" when none. */
const char *case_ops_with_mode(void);

/* Whether the exec's mode and chunk size mean anything to the case's op (KDA). */
bool case_has_mode(const ls_case *c);

/* DIR/NAME + EXT in a new string (NULL when out of memory). */
char *case_path(const char *dir, const char *name, const char *ext);

#endif
