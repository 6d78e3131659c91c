// The C entry points of a prebuilt kernel library (losslab/build/prebuilt.py): a plain shared
// library, tied to no Python and no PyTorch C++ ABI, that Python calls through ctypes. Each
// launcher is listed once with its parameter types encoded at compile time from its declaration,
// so Python sets the argument types from the launcher itself, not from a copy of its signature:
//
//   static const LosslabEntry ENTRIES[] = {LOSSLAB_EXPORT(naive_forward, &kl_div_naive_forward), ...};
//   LOSSLAB_EXPORT_ENTRIES(ENTRIES)
//
// Parameter codes: p pointer (device pointers, cudaStream_t), q int64_t, i int (and DType), f float.
// Result codes: e cudaError_t (Python raises on an error), s a C string (the function writes its
// numbers through its last `outputs` int64_t* parameters).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

struct LosslabEntry {
    const char* name;    // the attribute Python gives it: <rung>_forward, ...
    void* function;
    const char* params;  // one code per parameter
    char result;
    int outputs;         // trailing int64_t* parameters the function writes (result s)
};

namespace losslab_c {
template <typename T> struct Code;
template <typename T> struct Code<T*> { static constexpr char value = 'p'; };
template <> struct Code<int64_t> { static constexpr char value = 'q'; };
template <> struct Code<int> { static constexpr char value = 'i'; };
template <> struct Code<DType> { static constexpr char value = 'i'; };  // enum class DType : int
template <> struct Code<float> { static constexpr char value = 'f'; };
template <typename R> struct Result;
template <> struct Result<cudaError_t> { static constexpr char value = 'e'; };
template <> struct Result<const char*> { static constexpr char value = 's'; };

template <typename... P> inline constexpr char params[] = {Code<P>::value..., '\0'};

template <typename R, typename... P>
constexpr LosslabEntry entry(const char* name, R (*function)(P...), int outputs = 0) {
    return {name, reinterpret_cast<void*>(function), params<P...>, Result<R>::value, outputs};
}
}  // namespace losslab_c

#define LOSSLAB_EXPORT(name, function) losslab_c::entry(#name, function),
// <rung>_forward and <rung>_backward of <problem>_<rung>_forward/_backward (an X-macro's X).
#define LOSSLAB_EXPORT_RUNG(problem, rung)                                  \
    LOSSLAB_EXPORT(rung##_forward, &problem##_##rung##_forward)             \
    LOSSLAB_EXPORT(rung##_backward, &problem##_##rung##_backward)

// losslab_entries(&table) -> the number of entries; losslab_error_string(code): CUDA's message.
#define LOSSLAB_EXPORT_ENTRIES(table)                                                   \
    extern "C" int losslab_entries(const LosslabEntry** entries) {                     \
        *entries = table;                                                               \
        return int(sizeof(table) / sizeof(table[0]));                                   \
    }                                                                                   \
    extern "C" const char* losslab_error_string(int code) {                            \
        return cudaGetErrorString(static_cast<cudaError_t>(code));                     \
    }
