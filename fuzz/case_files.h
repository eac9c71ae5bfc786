/* The file names of the case-loader target's records (fuzz_case.c): a record's tag picks its
 * file by its index here. The index is the encoding of every input in fuzz/corpus/case, so
 * the order never changes: a name is appended, never inserted, and fuzz/make_seeds.py reads
 * this list to write its seeds. Tags past the list wrap onto its first FZ_CASE_CORPUS_FILES
 * names, as every tag did when the corpus was made; appending names changes only tags
 * FZ_CASE_CORPUS_FILES .. (count - 1), which no committed input used when the names after
 * "o" were appended.
 *
 * Every file a case of an op of the table can read (its inputs and upstream gradients, and
 * cu_seqlens) must be here, or the fuzzer could never write it: tests/test_op_coverage.c
 * checks that, naming what is missing. The outputs "ht" and "o" stand for files a case
 * folder may hold that no case reads. */
#ifndef LS_FUZZ_CASE_FILES_H
#define LS_FUZZ_CASE_FILES_H

#include <stddef.h>

static const char *const fz_case_files[] = {
    "meta.json", "q", "k", "v", "beta", "g", "h0", "cu_seqlens", "d_o", "d_ht", "A_log", "dt_bias",
    "g_raw", "d_g", "x", "dt", "A", "B", "C", "D", "gate", "d_y", "d_hT", "weight", "bias",
    "conv_state", "ht", "o",
    /* appended: the upstream gradients of the conv's state and of the segment summaries */
    "d_conv_state_out", "d_P", "d_R",
    /* appended: the EMA's decay */
    "a"};

#define FZ_CASE_FILES (sizeof fz_case_files / sizeof fz_case_files[0])
#define FZ_CASE_CORPUS_FILES 28 /* the list when fuzz/corpus/case was made */

/* The file of a record's tag (its low 7 bits). */
static inline const char *fz_case_file(unsigned tag)
{
    const size_t i = tag & 0x7f;
    return fz_case_files[i < FZ_CASE_FILES ? i : i % FZ_CASE_CORPUS_FILES];
}

#endif
