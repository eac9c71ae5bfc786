/* The file names of the case-loader target's records (fuzz_case.c): a record's tag picks its
 * file by its index in fz_case_file_list(). The index is the encoding of every input in
 * fuzz/corpus/case, so what a tag means never changes:
 *   - tags 0 .. FZ_CASE_LEGACY_FILES - 1 are the fixed list below, written by hand while ops
 *     were added by hand; it is never edited again (fuzz/make_seeds.py reads it to write its
 *     seeds);
 *   - then, from the op table at run time, every INPUT and UPSTREAM tensor name of every op
 *     of ls_ops() that the list does not have yet, op by op in table order and tensor by
 *     tensor in each op's order: a new op's files are appended by adding the op to the table
 *     (ops are appended there too, so earlier ops' names keep their tags), with no edit
 *     here. Today every name of the table is in the fixed list, so this part is empty;
 *   - tags past the whole list wrap onto its first FZ_CASE_CORPUS_FILES names, as every tag
 *     did when the corpus was made. A name appended (by hand before, from the table now)
 *     re-points only the wrapped tags at its index, as appending always has; the fixed
 *     list's tags keep their meaning.
 * So every file a case of an op of the table can read (its inputs and upstream gradients;
 * cu_seqlens is in the fixed list) has a tag by construction; tests/test_op_coverage.c checks
 * that the whole list fits the 7-bit tag and names each such file. The outputs "ht" and "o"
 * stand for files a case folder may hold that no case reads. */
#ifndef LS_FUZZ_CASE_FILES_H
#define LS_FUZZ_CASE_FILES_H

#include <stddef.h>
#include <string.h>

#include "optable/optable.h"

static const char *const fz_case_legacy_files[] = {
    "meta.json", "q", "k", "v", "beta", "g", "h0", "cu_seqlens", "d_o", "d_ht", "A_log", "dt_bias",
    "g_raw", "d_g", "x", "dt", "A", "B", "C", "D", "gate", "d_y", "d_hT", "weight", "bias",
    "conv_state", "ht", "o",
    /* appended: the upstream gradients of the conv's state and of the segment summaries */
    "d_conv_state_out", "d_P", "d_R",
    /* appended: the EMA's decay */
    "a"};

#define FZ_CASE_LEGACY_FILES (sizeof fz_case_legacy_files / sizeof fz_case_legacy_files[0])
#define FZ_CASE_CORPUS_FILES 28 /* the list when fuzz/corpus/case was made */
#define FZ_CASE_MAX_FILES 128   /* a tag's 7 bits */

/* The whole list (built on the first call); *count its length, *dropped the names of the
 * table past FZ_CASE_MAX_FILES (0 unless the table outgrows the tag). */
static inline const char *const *fz_case_file_list(size_t *count, size_t *dropped)
{
    static const char *list[FZ_CASE_MAX_FILES];
    static size_t n, lost;
    if (n == 0) {
        for (size_t i = 0; i < FZ_CASE_LEGACY_FILES; i++) list[n++] = fz_case_legacy_files[i];
        int n_ops;
        const ls_op *const *ops = ls_ops(&n_ops);
        for (int i = 0; i < n_ops; i++)
            for (int k = 0; k < ops[i]->n_tensors; k++) {
                const ls_tensor_desc *t = &ops[i]->tensors[k];
                if (t->role != LS_ROLE_INPUT && t->role != LS_ROLE_UPSTREAM) continue;
                size_t j = 0;
                while (j < n && strcmp(list[j], t->name) != 0) j++;
                if (j < n) continue;
                if (n < FZ_CASE_MAX_FILES)
                    list[n++] = t->name;
                else
                    lost++;
            }
    }
    if (count) *count = n;
    if (dropped) *dropped = lost;
    return list;
}

/* The file of a record's tag (its low 7 bits). */
static inline const char *fz_case_file(unsigned tag)
{
    size_t n;
    const char *const *list = fz_case_file_list(&n, NULL);
    const size_t i = tag & 0x7f;
    return list[i < n ? i : i % FZ_CASE_CORPUS_FILES];
}

#endif
