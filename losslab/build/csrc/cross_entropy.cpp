// Python binding of the cross_entropy launchers. pybind11 only, no torch
// headers, so this unit compiles in seconds: Python validates and allocates the
// tensors and passes their data pointers, the dtype code and the current CUDA
// stream as integers.
#include <pybind11/pybind11.h>
#include <stdexcept>
#include <string>
#include "cross_entropy/launchers.h"

template <typename T>
static T* as_ptr(uintptr_t address) { return reinterpret_cast<T*>(address); }

static void throw_on_error(cudaError_t err, const char* what) {
    if (err != cudaSuccess)
        throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

#define BIND_FLOAT_VARIANT(m, variant)                                                              \
    m.def(#variant "_forward", [](uintptr_t logits, uintptr_t targets, uintptr_t counts,            \
                                  uintptr_t row_losses, uintptr_t row_max, uintptr_t row_log_sum,   \
                                  uintptr_t loss, int64_t N, int64_t C, uintptr_t stream) {         \
        throw_on_error(cross_entropy_##variant##_forward(                                           \
                           as_ptr<const float>(logits), as_ptr<const int64_t>(targets),             \
                           as_ptr<const int64_t>(counts), as_ptr<float>(row_losses),                \
                           as_ptr<float>(row_max), as_ptr<float>(row_log_sum), as_ptr<float>(loss), \
                           N, C, as_ptr<CUstream_st>(stream)),                                      \
                       "cross_entropy " #variant " forward");                                       \
    });                                                                                             \
    m.def(#variant "_backward", [](uintptr_t logits, uintptr_t targets, uintptr_t row_max,          \
                                   uintptr_t row_log_sum, uintptr_t counts, uintptr_t grad_loss,    \
                                   uintptr_t grad_logits, int64_t N, int64_t C, uintptr_t stream) { \
        throw_on_error(cross_entropy_##variant##_backward(                                          \
                           as_ptr<const float>(logits), as_ptr<const int64_t>(targets),             \
                           as_ptr<const float>(row_max), as_ptr<const float>(row_log_sum),          \
                           as_ptr<const int64_t>(counts), as_ptr<const float>(grad_loss),           \
                           as_ptr<float>(grad_logits), N, C, as_ptr<CUstream_st>(stream)),          \
                       "cross_entropy " #variant " backward");                                      \
    });

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "losslab cross_entropy kernels: count_targets, then <variant>_forward and <variant>_backward per rung";
    m.def("count_targets", [](uintptr_t targets, uintptr_t counts, int64_t N, int64_t C, uintptr_t stream) {
        throw_on_error(cross_entropy_count_targets(as_ptr<const int64_t>(targets), as_ptr<int64_t>(counts), N, C,
                                                   as_ptr<CUstream_st>(stream)),
                       "cross_entropy count_targets");
    });
    BIND_FLOAT_VARIANT(m, naive)
    BIND_FLOAT_VARIANT(m, shared_memory)
    BIND_FLOAT_VARIANT(m, warp_shuffle)
    m.def("vectorized_forward", [](uintptr_t logits, uintptr_t targets, uintptr_t counts, uintptr_t row_losses,
                                   uintptr_t row_max, uintptr_t row_log_sum, uintptr_t loss, int64_t N,
                                   int64_t C, int dtype, uintptr_t stream) {
        throw_on_error(cross_entropy_vectorized_forward(
                           as_ptr<const void>(logits), as_ptr<const int64_t>(targets), as_ptr<const int64_t>(counts),
                           as_ptr<float>(row_losses), as_ptr<float>(row_max), as_ptr<float>(row_log_sum),
                           as_ptr<float>(loss), N, C, DType(dtype), as_ptr<CUstream_st>(stream)),
                       "cross_entropy vectorized forward");
    });
    m.def("vectorized_backward", [](uintptr_t logits, uintptr_t targets, uintptr_t row_max, uintptr_t row_log_sum,
                                    uintptr_t counts, uintptr_t grad_loss, uintptr_t grad_logits, int64_t N,
                                    int64_t C, int dtype, uintptr_t stream) {
        throw_on_error(cross_entropy_vectorized_backward(
                           as_ptr<const void>(logits), as_ptr<const int64_t>(targets), as_ptr<const float>(row_max),
                           as_ptr<const float>(row_log_sum), as_ptr<const int64_t>(counts),
                           as_ptr<const float>(grad_loss), as_ptr<void>(grad_logits), N, C, DType(dtype),
                           as_ptr<CUstream_st>(stream)),
                       "cross_entropy vectorized backward");
    });
    m.def("fused_forward", [](uintptr_t logits, uintptr_t targets, uintptr_t counts, uintptr_t row_losses,
                              uintptr_t loss, uintptr_t grad_logits, int64_t N, int64_t C, int dtype,
                              uintptr_t stream) {
        throw_on_error(cross_entropy_fused_forward(
                           as_ptr<const void>(logits), as_ptr<const int64_t>(targets), as_ptr<const int64_t>(counts),
                           as_ptr<float>(row_losses), as_ptr<float>(loss), as_ptr<void>(grad_logits), N, C,
                           DType(dtype), as_ptr<CUstream_st>(stream)),
                       "cross_entropy fused forward");
    });
    m.def("fused_backward", [](uintptr_t grad_logits, uintptr_t grad_loss, int64_t n, int dtype, uintptr_t stream) {
        throw_on_error(cross_entropy_fused_backward(as_ptr<void>(grad_logits), as_ptr<const float>(grad_loss), n,
                                                    DType(dtype), as_ptr<CUstream_st>(stream)),
                       "cross_entropy fused backward");
    });
}
