// 128-bit (16-byte) global loads and stores, and the alignment test that
// guards them. One 16-byte access is one LDG.E.128/STG.E.128 instruction: four
// floats or eight 16-bit values per instruction instead of one, but only legal
// on a 16-byte aligned address.
#pragma once
#include <cstdint>
#include <type_traits>
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
// so 16-bit packs cost no more registers in flight than float ones. A 16-bit
// element is widened straight from its 32-bit word (bf16: one shift or mask;
// fp16: one HADD2.F32), and pairs are narrowed by one packing conversion
// (F2FP), never through a 16-bit register and a merge.
template <typename T>
struct Pack {
    static constexpr int size = 16 / sizeof(T);
    union {
        uint4 raw;
        uint32_t words[4];
        T elems[size];
    };
    __device__ __forceinline__ float operator[](int k) const;
    __device__ __forceinline__ void set(int k, float x) { elems[k] = from_float<T>(x); }
};

template <> __device__ __forceinline__ float Pack<float>::operator[](int k) const { return __uint_as_float(words[k]); }
template <> __device__ __forceinline__ float Pack<__nv_bfloat16>::operator[](int k) const {
    const uint32_t w = words[k / 2];
    return k % 2 ? __uint_as_float(w & 0xffff0000u) : __uint_as_float(w << 16);  // bf16: a float's top half
}
template <> __device__ __forceinline__ float Pack<__half>::operator[](int k) const {
    const uint32_t w = words[k / 2];
    return __half2float(__ushort_as_half(static_cast<unsigned short>(k % 2 ? w >> 16 : w & 0xffffu)));
}

// Two floats as one 32-bit word of T (round to nearest even), for pack_of.
__device__ __forceinline__ uint32_t pair_bits(float a, float b, __nv_bfloat16*) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t pair_bits(float a, float b, __half*) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// The element-wise maximum of two words of 16-bit values: one HMNMX2 for two
// elements (exact: a maximum does not round). Like fmaxf, it drops a NaN.
template <typename T>
__device__ __forceinline__ uint32_t max_bits(uint32_t a, uint32_t b) {
    using T2 = typename std::conditional<std::is_same<T, __half>::value, __half2, __nv_bfloat162>::type;
    const T2 m = __hmax2(*reinterpret_cast<const T2*>(&a), *reinterpret_cast<const T2*>(&b));
    return *reinterpret_cast<const uint32_t*>(&m);
}

// The pack holding f[0..size) rounded to T.
template <typename T>
__device__ __forceinline__ Pack<T> pack_of(const float (&f)[Pack<T>::size]) {
    Pack<T> pack;
    if constexpr (sizeof(T) == 4) {
#pragma unroll
        for (int k = 0; k < 4; ++k) pack.words[k] = __float_as_uint(f[k]);
    } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) pack.words[k] = pair_bits(f[2 * k], f[2 * k + 1], static_cast<T*>(nullptr));
    }
    return pack;
}

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

// Elements before the first 16-byte boundary of a, or -1 if the non-null pointers among b, c, d sit
// at other offsets from one (then every element goes the scalar way).
__device__ __forceinline__ int64_t common_head(int64_t n, const void* a, const void* b, const void* c,
                                               const void* d, int size) {
    const uintptr_t offset = reinterpret_cast<uintptr_t>(a) % 16;
    for (const void* p : {b, c, d})
        if (p && reinterpret_cast<uintptr_t>(p) % 16 != offset) return -1;
    return min(n, int64_t((16 - offset) % 16 / size));
}
