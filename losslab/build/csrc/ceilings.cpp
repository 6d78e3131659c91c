// Python binding of the device-ceiling launchers (kernels/ceilings/). pybind11
// only, no torch headers: Python allocates the output and passes its data
// pointer and the current CUDA stream as integers.
#include <pybind11/pybind11.h>
#include <stdexcept>
#include <string>
#include "ceilings/launchers.h"

static void throw_on_error(cudaError_t err, const char* what) {
    if (err != cudaSuccess)
        throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "losslab device ceilings: streaming read bandwidth, FP32 FMA and MUFU (exp2) throughput";
    m.attr("THREADS") = CEILING_THREADS;
    m.attr("CHAINS") = CEILING_CHAINS;
    m.def("fma_throughput", [](uintptr_t out, int blocks, int iterations, float a, float b,
                               uintptr_t stream) {
        throw_on_error(fma_throughput(reinterpret_cast<float*>(out), blocks, iterations, a, b,
                                      reinterpret_cast<cudaStream_t>(stream)),
                       "fma_throughput");
    });
    m.def("stream_blocks", &stream_blocks);
    m.def("stream_read", [](uintptr_t in, int64_t n4, uintptr_t out, int unroll, uintptr_t stream) {
        throw_on_error(stream_read(reinterpret_cast<const float*>(in), n4, reinterpret_cast<float*>(out), unroll,
                                   reinterpret_cast<cudaStream_t>(stream)),
                       "stream_read");
    });
    m.def("mufu_ex2_throughput", [](uintptr_t out, int blocks, int iterations, uintptr_t stream) {
        throw_on_error(mufu_ex2_throughput(reinterpret_cast<float*>(out), blocks, iterations,
                                           reinterpret_cast<cudaStream_t>(stream)),
                       "mufu_ex2_throughput");
    });
}
