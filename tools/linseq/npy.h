/* .npy files (NumPy format versions 1.0, 2.0 and 3.0), limited to the two dtypes the
 * reference data uses: little-endian float32 ('<f4') and int64 ('<i8', cu_seqlens only).
 *
 * The reader trusts nothing in the file: every header field is parsed and checked, the
 * shape's element count and byte size are computed with overflow checks, and the data
 * length must match the shape exactly. Every failure is reported as "PATH: reason". */
#ifndef LS_TOOLS_NPY_H
#define LS_TOOLS_NPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define NPY_MAX_DIMS 8

typedef enum npy_dtype { NPY_F32 = 0, NPY_I64 = 1 } npy_dtype;

typedef struct npy_array {
    npy_dtype dtype;
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
    size_t count; /* product of shape (1 for a 0-d array) */
    void *data;   /* count elements in host order, C order; owned */
} npy_array;

/* Reads PATH into *out (zeroed first). On failure returns false, leaves *out empty and
 * writes "PATH: reason" to err. PATH must be a regular file (see open_regular_file). */
bool npy_read(const char *path, npy_array *out, char *err, size_t err_size);

/* Opens PATH for reading when it is a regular file, with its size in *size; NULL with
 * "PATH: reason" in err otherwise. A device or a pipe is refused without reading it (and a
 * FIFO without waiting for a writer): it has no size to bound the read, and may never end.
 * The case loader opens meta.json through it too. */
FILE *open_regular_file(const char *path, uint64_t *size, char *err, size_t err_size);

/* The same parser on a whole .npy image in memory (N bytes at BUF, copied into *out); NAME
 * stands for the path in messages. */
bool npy_parse(const void *buf, size_t n, const char *name, npy_array *out, char *err,
               size_t err_size);

/* Allocates a zero-filled float32 array of the given shape; false (with err) when the size
 * overflows or memory runs out. */
bool npy_alloc_f32(npy_array *out, int ndim, const int64_t *shape, char *err, size_t err_size);

void npy_free(npy_array *a);

/* Writes a float32 array as a version 1.0 .npy file with the data 64-byte aligned. The
 * file is written under a temporary name in the same folder and renamed into place, so
 * PATH either keeps its old content or holds the complete new file. */
bool npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape, char *err,
                   size_t err_size);

/* The first half of npy_write_f32: writes the file complete under a new hidden name in
 * PATH's folder ("DIR/.NAME.XXXXXX") and returns that name (malloc'd) for the caller to
 * rename onto PATH; NULL with err on failure, nothing left behind. */
char *npy_write_f32_temp(const char *path, const float *data, int ndim, const int64_t *shape,
                         char *err, size_t err_size);

/* Creates a new empty file with a unique hidden name beside PATH ("DIR/.NAME.XXXXXX", same
 * folder, so a rename between the two is atomic), stores the name (malloc'd) in *name and
 * returns its open descriptor; -1 with errno on failure. The name is listed for removal
 * should SIGINT or SIGTERM end the process (the first call installs the handlers, where
 * those signals are not ignored; a handler removes every listed file and raises the signal
 * again) until npy_temps_forget: call it, before freeing the name, once the file is renamed
 * or removed. */
#define NPY_TEMP_SLOTS 64
int hidden_sibling(const char *path, char **name);
void npy_temps_forget(const char *name);
/* Forgets every listed file (their fate settled by the caller). */
void npy_temps_forget_all(void);
/* The files listed now (tests). */
int npy_temps_count(void);

/* With on, SIGINT and SIGTERM are held (while files are renamed into place, so that the
 * folder is never left half swapped); off acts on one that arrived meanwhile. */
void npy_temps_defer(bool on);

/* Element count of a shape; false when a dimension is negative or the product overflows. */
bool npy_shape_count(int ndim, const int64_t *shape, size_t *count);

/* "[2, 3, 4]" (NumPy prints a tuple, but brackets read better next to meta.json). */
void npy_shape_text(int ndim, const int64_t *shape, char *buf, size_t n);

/* "float32" / "int64" */
const char *npy_dtype_name(npy_dtype dtype);

#endif
