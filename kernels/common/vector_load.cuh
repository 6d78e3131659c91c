// 128-bit (16-byte) global loads and stores, and the alignment test that
// guards them. One 16-byte access is one LDG.E.128/STG.E.128 instruction: four
// floats or eight 16-bit values per instruction instead of one, but only legal
// on a 16-byte aligned address.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

__host__ __device__ __forceinline__ bool is_aligned_16(const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

// Elements to skip from ptr until the next 16-byte boundary.
template <typename T>
__host__ __device__ __forceinline__ int elements_to_alignment(const T* ptr) {
    return static_cast<int>((16 - reinterpret_cast<uintptr_t>(ptr) % 16) % 16 / sizeof(T));
}

__device__ __forceinline__ float4 load_float4(const float* ptr) {
    return *reinterpret_cast<const float4*>(ptr);
}

// Storage types and fp32 math: 16-bit inputs are widened on load and the
// arithmetic runs in fp32 (explicit conversions: torch builds with the
// implicit half/bfloat16 conversions switched off).
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// A pack is the elements of T that fit in 16 bytes: 4 floats or 8 halves. It
// keeps the raw bits (4 registers) and widens an element only when it is used,
// so 16-bit packs cost no more registers in flight than float ones.
template <typename T>
struct Pack {
    static constexpr int size = 16 / sizeof(T);
    union {
        uint4 raw;
        T elems[size];
    };
    __device__ __forceinline__ float operator[](int k) const { return to_float(elems[k]); }
    __device__ __forceinline__ void set(int k, float x) { elems[k] = from_float<T>(x); }
};

template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* ptr) {  // ptr 16-byte aligned
    Pack<T> pack;
    pack.raw = *reinterpret_cast<const uint4*>(ptr);
    return pack;
}

template <typename T>
__device__ __forceinline__ void store_pack(T* ptr, const Pack<T>& pack) {  // ptr 16-byte aligned
    *reinterpret_cast<uint4*>(ptr) = pack.raw;
}

// Shorthand for float-only callers.
__host__ __device__ __forceinline__ int floats_to_alignment(const float* ptr) {
    return elements_to_alignment(ptr);
}
