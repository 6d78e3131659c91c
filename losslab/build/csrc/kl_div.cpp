// Python binding of the kl_div launchers. pybind11 only, no torch headers, so
// this unit compiles in seconds: Python validates and allocates the tensors
// and passes their data pointers, the dtype code and the current CUDA stream
// as integers.
#include <pybind11/pybind11.h>
#include <stdexcept>
#include <string>
#include "kl_div/launchers.h"

template <typename T>
static T* as_ptr(uintptr_t address) { return reinterpret_cast<T*>(address); }

static cudaStream_t as_stream(uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

static void throw_on_error(cudaError_t err, const char* what) {
    if (err != cudaSuccess)
        throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

#define BIND_FLOAT_VARIANT(m, variant)                                                             \
    m.def(#variant "_forward", [](uintptr_t predictions, uintptr_t targets, uintptr_t row_partials, \
                                  uintptr_t loss, int64_t B, int64_t D, uintptr_t stream) {        \
        throw_on_error(kl_div_##variant##_forward(as_ptr<const float>(predictions),              \
                                                  as_ptr<const float>(targets),                  \
                                                  as_ptr<float>(row_partials), as_ptr<float>(loss), \
                                                  B, D, as_stream(stream)),                      \
                       "kl_div " #variant " forward");                                           \
    });                                                                                         \
    m.def(#variant "_backward", [](uintptr_t predictions, uintptr_t targets, uintptr_t grad_loss,  \
                                   uintptr_t grad_predictions, int64_t B, int64_t D,            \
                                   uintptr_t stream) {                                          \
        throw_on_error(kl_div_##variant##_backward(as_ptr<const float>(predictions),             \
                                                   as_ptr<const float>(targets),                 \
                                                   as_ptr<const float>(grad_loss),               \
                                                   as_ptr<float>(grad_predictions), B, D,        \
                                                   as_stream(stream)),                           \
                       "kl_div " #variant " backward");                                          \
    });

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "losslab kl_div kernels: <variant>_forward and <variant>_backward per rung";
    BIND_FLOAT_VARIANT(m, naive)
    BIND_FLOAT_VARIANT(m, shared_memory)
    BIND_FLOAT_VARIANT(m, warp_shuffle)
    m.def("vectorized_forward", [](uintptr_t predictions, uintptr_t targets, uintptr_t row_partials,
                                   uintptr_t loss, int64_t B, int64_t D, int dtype, uintptr_t stream) {
        throw_on_error(kl_div_vectorized_forward(as_ptr<const void>(predictions), as_ptr<const void>(targets),
                                                 as_ptr<float>(row_partials), as_ptr<float>(loss), B, D,
                                                 DType(dtype), as_stream(stream)),
                       "kl_div vectorized forward");
    });
    m.def("vectorized_backward", [](uintptr_t predictions, uintptr_t targets, uintptr_t grad_loss,
                                    uintptr_t grad_predictions, int64_t B, int64_t D, int dtype,
                                    uintptr_t stream) {
        throw_on_error(kl_div_vectorized_backward(as_ptr<const void>(predictions), as_ptr<const void>(targets),
                                                  as_ptr<const float>(grad_loss), as_ptr<void>(grad_predictions),
                                                  B, D, DType(dtype), as_stream(stream)),
                       "kl_div vectorized backward");
    });
    m.def("fused_forward", [](uintptr_t predictions, uintptr_t targets, uintptr_t row_partials,
                              uintptr_t loss, uintptr_t grad_predictions, int64_t B, int64_t D,
                              int dtype, uintptr_t stream) {
        throw_on_error(kl_div_fused_forward(as_ptr<const void>(predictions), as_ptr<const void>(targets),
                                            as_ptr<float>(row_partials), as_ptr<float>(loss),
                                            as_ptr<void>(grad_predictions), B, D, DType(dtype),
                                            as_stream(stream)),
                       "kl_div fused forward");
    });
    m.def("fused_backward", [](uintptr_t grad_predictions, uintptr_t grad_loss, int64_t n, int dtype,
                               uintptr_t stream) {
        throw_on_error(kl_div_fused_backward(as_ptr<void>(grad_predictions), as_ptr<const float>(grad_loss),
                                             n, DType(dtype), as_stream(stream)),
                       "kl_div fused backward");
    });
}
