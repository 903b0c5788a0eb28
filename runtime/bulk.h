/* Loops over whole buffers that the runtime runs on the host around collectives: 16-bit
 * floats (bf16, f16) to f32 and back, bit for bit as ir.h's per-element conversions (round
 * to nearest even, NaN kept a NaN), for the communicator's f32 staging of 16-bit
 * all-reduces; and f32 scaled by a constant, for the gradients' 1/world. 16 elements at a
 * time with AVX-512 where the CPU has it (checked at run time), element by element
 * elsewhere: the library is built for baseline x86-64, where the compiler's -O2 leaves
 * such loops scalar (vectorizing the MLP's 2.7 MB bucket copy-in took 0.07 ms off its 1.37 ms
 * data-parallel step; narrowing 6.25M values to bf16 took 5.0 ms scalar, 0.9 ms here). */
#ifndef LOOM_RUNTIME_BULK_H
#define LOOM_RUNTIME_BULK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/loom.h"

/* dst[i] = src[i] as f32, for dt bf16 or f16 (other dtypes: nothing is written). */
void loom_rt_widen16(float *dst, const uint16_t *src, size_t n, loom_dtype dt);

/* dst[i] = (src[i] * scale, in f32) rounded to dt, bf16 or f16. */
void loom_rt_narrow16(uint16_t *dst, const float *src, size_t n, float scale, loom_dtype dt);

/* dst[i] = src[i] * scale in f32; dst may be src. */
void loom_rt_scale_f32(float *dst, const float *src, size_t n, float scale);

/* Whether the three above run the vector path on this CPU (tests print which they checked). */
bool loom_rt_bulk_vector(void);

/* Tests only: false forces the element-by-element path (true: the CPU's best again). */
void loom_rt_bulk_allow_vector(bool allow);

#endif
