/* Internal: the scalar conversions between float32 and the 16-bit floats state pools and
 * tensors may be stored in: bfloat16 (the upper half of a float32) and IEEE binary16. Widening
 * is exact; narrowing rounds once, to nearest even, keeps a NaN a (quiet) NaN with its sign,
 * and rounds subnormals like any other value. */
#ifndef LS_CORE_HALF_FLOAT_H
#define LS_CORE_HALF_FLOAT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float ls_bf16_to_f32(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t ls_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float ls_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1fu) { /* infinity, NaN */
        u = sign | 0x7f800000u | (mant << 13);
    } else if (exp) { /* normal: rebias the exponent from 15 to 127 */
        u = sign | ((exp + 112u) << 23) | (mant << 13);
    } else { /* zero, subnormal: mant * 2^-24, exact in float32 */
        const float f = (float)mant * 0x1p-24f;
        memcpy(&u, &f, sizeof u);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t ls_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up round to inf */
    if (a >= 0x38800000u) { /* a normal half (>= 2^-14): rebias, round the 13 dropped bits */
        uint32_t r = a - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    /* a subnormal half or zero: the count of 2^-24 steps, rounded to nearest even (the
     * scaling by 2^24 is exact; rintf rounds in the default mode, to nearest even) */
    float v;
    memcpy(&v, &a, sizeof v);
    return (uint16_t)(sign | (uint16_t)rintf(v * 0x1p24f));
}

#endif
