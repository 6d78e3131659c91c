// The backward of every rung that writes its gradient in the forward (for
// grad_loss = 1): scale that gradient by grad_loss, in place.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

cudaError_t scale_in_place(void* data,          // (n,) of dtype, scaled in place
                           const void* scale,   // () of dtype, read on the device: no host synchronization
                           int64_t n, DType dtype, cudaStream_t stream);
