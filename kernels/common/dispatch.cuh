// Run a templated launch for the element type a DType code names:
//   dispatch_dtype(dtype, [&](auto tag) { using T = decltype(tag); ... });
#pragma once
#include "common/dtype.h"
#include "common/vector_load.cuh"

template <typename Launch>
cudaError_t dispatch_dtype(DType dtype, Launch&& launch) {
    switch (dtype) {
        case DType::float32: return launch(float{});
        case DType::bfloat16: return launch(__nv_bfloat16{});
        case DType::float16: return launch(__half{});
    }
    return cudaErrorInvalidValue;
}
