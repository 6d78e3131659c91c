// Binding a launcher to Python without restating its parameter list: pybind11
// only, no torch headers (a binding unit compiles in seconds; torch's headers
// cost about 100 s). Python passes every pointer (data pointers, the CUDA
// stream) as an integer, the DType as its code, sizes as integers.
//
//   bind(m, "naive_forward", &kl_div_naive_forward);
//
// defines naive_forward(*ints) that calls the launcher and raises RuntimeError
// with CUDA's message when it returns an error.
#pragma once
#include <pybind11/pybind11.h>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <cuda_runtime.h>
#include "common/dtype.h"

namespace losslab {

// How one C parameter type travels from Python: `type` is what pybind11
// converts the Python argument to, `from` turns it into the C argument.
template <typename T>
struct Arg {  // integers and floats as they are
    using type = T;
    static T from(T value) { return value; }
};
template <typename T>
struct Arg<T*> {  // device pointers and cudaStream_t (a pointer type): addresses as integers
    using type = uintptr_t;
    static T* from(uintptr_t address) { return reinterpret_cast<T*>(address); }
};
template <>
struct Arg<DType> {  // the code of common/dtype.h; a launcher refuses one it does not know
    using type = int;
    static DType from(int code) { return static_cast<DType>(code); }
};

inline void throw_on_error(cudaError_t err, const std::string& what) {
    if (err != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorString(err));
}

template <typename... Params>
void bind(pybind11::module_& m, const char* name, cudaError_t (*launcher)(Params...)) {
    const std::string what = name;
    m.def(name, [launcher, what](typename Arg<Params>::type... args) {
        throw_on_error(launcher(Arg<Params>::from(args)...), what);
    });
}

}  // namespace losslab

// <rung>_forward and <rung>_backward of one rung whose launchers are <problem>_<rung>_forward and
// <problem>_<rung>_backward; a binding applies it to each rung of an X-macro list:
//   #define BIND_RUNG(rung) LOSSLAB_BIND_RUNG(m, kl_div, rung)
//   KL_DIV_RUNGS(BIND_RUNG)
#define LOSSLAB_BIND_RUNG(m, problem, rung)                                 \
    losslab::bind(m, #rung "_forward", &problem##_##rung##_forward);        \
    losslab::bind(m, #rung "_backward", &problem##_##rung##_backward);
