// x * log(y) with torch.xlogy's convention: 0 where x == 0 (so 0 * log 0 = 0),
// NaN wherever y is NaN.
#pragma once
#include <math.h>

__device__ __forceinline__ float xlogy(float x, float y) {
    if (isnan(y)) return NAN;
    if (x == 0.0f) return 0.0f;
    return x * logf(y);
}
