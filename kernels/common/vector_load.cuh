// 128-bit (16-byte) global loads and the alignment test that guards them.
// A float4 load is one LDG.E.128 instruction: four times the bytes in flight
// per instruction of a scalar load, but only legal on a 16-byte aligned address.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

__host__ __device__ __forceinline__ bool is_aligned_16(const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

// Floats to skip from ptr until the next 16-byte boundary (0 to 3).
__host__ __device__ __forceinline__ int floats_to_alignment(const float* ptr) {
    return static_cast<int>((16 - reinterpret_cast<uintptr_t>(ptr) % 16) % 16 / sizeof(float));
}

__device__ __forceinline__ float4 load_float4(const float* ptr) {
    return *reinterpret_cast<const float4*>(ptr);
}

__device__ __forceinline__ void store_float4(float* ptr, float4 value) {
    *reinterpret_cast<float4*>(ptr) = value;
}
