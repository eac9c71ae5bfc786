/* The pass/fail rule of the reference data (README section 8), computed in double exactly
 * as the independent judge check_npy_dir.py computes it:
 *
 *   the candidate must be finite and have exactly the reference shape; then
 *   max|ref| == 0:  max|cand - ref| <= tolerance_abs_floor            (cosine unused)
 *   otherwise:      max|cand - ref| / max|ref| <= tolerance[file].max_rel_err
 *                   and cos(cand, ref) >= tolerance[file].min_cos
 *
 * cos is <c,r> / (|c| |r|); when either norm is 0 it is 1 if both are, else 0. */
#ifndef LS_TOOLS_COMPARE_H
#define LS_TOOLS_COMPARE_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "npy.h"

typedef struct cmp_tol {
    double max_rel_err, min_cos, abs_floor;
} cmp_tol;

typedef struct cmp_result {
    bool pass, shape_ok;
    double max_abs_err, max_rel_err, cos, ref_max_abs; /* max_rel_err = max_abs_err if ref is 0 */
    char reason[192];                                  /* why it failed; "" when it passed */
} cmp_result;

/* The judge's defaults (outputs 1e-4 / 0.999999, gradients 1e-3 / 0.99999, floor 1e-6),
 * overridden field by field by meta.json's tolerance[file] and tolerance_abs_floor. False
 * (with err) when one of those is present but not a number. */
bool cmp_tolerance(const cJSON *meta, const char *file, bool is_grad, cmp_tol *tol, char *err,
                   size_t err_size);

/* Both arrays float32. */
void cmp_arrays(const npy_array *cand, const npy_array *ref, const cmp_tol *tol, cmp_result *r);

#endif
