// A CPU simulator of the CUDA thread hierarchy, enough for the workbook's exercises.
//
// Included (g++ -include) before a participant's .cu, after run.py has rewritten each
// launch `k<<<grid, block, smem, stream>>>(args)` into
// `::cuda_sim::launch(#k, ::cuda_sim::config(grid, block, smem, stream), k, args)`.
//
// Model: a launch runs its blocks one after another; a block's threads are fibers (one
// stack each, switched by hand on x86-64, by ucontext elsewhere) on one OS thread. A fiber
// runs until it reaches a barrier (__syncthreads), a warp collective (__shfl_*_sync,
// __syncwarp, __ballot_sync...) or its end; the scheduler then runs the next fiber. So:
//   - __shared__ is `static`: blocks never overlap, so one static object is exactly one
//     block's shared memory; each block starts with it (and dynamic shared memory) filled
//     with NaN bytes, so a read of a slot nobody wrote shows;
//   - a barrier releases when every live thread of the block waits at it; threads waiting
//     at different __syncthreads lines, or a deadlock, end the run with a diagnosis;
//   - a warp collective completes when every lane its mask names has reached it; a lane
//     outside its own mask, a mask naming a lane that exited or waits elsewhere, lanes
//     disagreeing on the mask, or a read from a lane outside the mask end the run;
//   - memory is the host's, so AddressSanitizer catches out-of-bounds accesses and
//     UBSan's alignment check catches a float4 load from an address that is not 16-byte
//     aligned (float4, int4, uint4 are alignas(16) as on the GPU);
//   - atomics are plain read-modify-writes (fibers never switch inside one);
//   - a thread's update of a shared element (`a[i] += v`, `a[i]++`, `a[i] = a[i] + v`: build.py
//     marks them) runs whole here, but on a GPU the lanes' reads and writes interleave: a
//     second thread updating the same address with no barrier between ends the run (a lost
//     update; an atomicAdd is one operation, not marked).
// Every diagnosis is one line on stderr, "@@SIM {json}", which run.py parses; the process
// then exits with status 3. SIM_ORDER=reverse runs each block's fibers in reverse order
// (a result that changes with the order is a race).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <algorithm>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

// ---- qualifiers: no-ops on the CPU ------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// empty, not __attribute__((noinline)): this header is included before the C++ headers, and
// libstdc++ 13 writes __attribute__((__noinline__)) itself, which the macro would break
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__ static
#define __constant__ static
#define __managed__

// ---- vector and 16-bit types ------------------------------------------------------------
struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) double2 { double x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

struct __half { uint16_t bits; };
struct __nv_bfloat16 { uint16_t bits; };
typedef __half half;

inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }

inline float __bfloat162float(__nv_bfloat16 h) { return __uint_as_float(unsigned(h.bits) << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    unsigned u = __float_as_uint(f);
    if (std::isnan(f)) return {uint16_t((u >> 16) | 0x40)};
    u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
    return {uint16_t(u >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __half2float(__half h) { _Float16 x; std::memcpy(&x, &h.bits, 2); return float(x); }
inline __half __float2half_rn(float f) { _Float16 x = _Float16(f); __half h; std::memcpy(&h.bits, &x, 2); return h; }
inline __half __float2half(float f) { return __float2half_rn(f); }

// The packed pairs kernels/common/vector_load.cuh uses: conversions of two floats, and the maximum.
struct __half2 { __half x, y; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
inline __half __ushort_as_half(unsigned short u) { return {u}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
inline __half2 __hmax2(__half2 a, __half2 b) {  // fmaxf's NaN rule; exact in 16 bits
    return {__float2half_rn(fmaxf(__half2float(a.x), __half2float(b.x))),
            __float2half_rn(fmaxf(__half2float(a.y), __half2float(b.y)))};
}
inline __nv_bfloat162 __hmax2(__nv_bfloat162 a, __nv_bfloat162 b) {
    return {__float2bfloat16_rn(fmaxf(__bfloat162float(a.x), __bfloat162float(b.x))),
            __float2bfloat16_rn(fmaxf(__bfloat162float(a.y), __bfloat162float(b.y)))};
}

// ---- math intrinsics --------------------------------------------------------------------
inline float __logf(float x) { return logf(x); }
inline float __expf(float x) { return expf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __exp2f(float x) { return exp2f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
template <typename T> inline T __ldg(const T* p) { return *p; }
// CUDA's device min/max accept mixed integer types; std::min does not.
template <typename A, typename B>
inline std::common_type_t<A, B> min(A a, B b) { return b < a ? b : a; }
template <typename A, typename B>
inline std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }

// ---- runtime API (host side) ------------------------------------------------------------
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9,
                   cudaErrorLaunchOutOfResources = 7 };
typedef cudaError_t cudaError;
struct CUstream_st;
typedef CUstream_st* cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
                      cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };
constexpr int warpSize = 32;

namespace cuda_sim {
inline cudaError_t& last_error() { static cudaError_t e = cudaSuccess; return e; }
}  // namespace cuda_sim
inline cudaError_t cudaGetLastError() { cudaError_t e = cuda_sim::last_error(); cuda_sim::last_error() = cudaSuccess; return e; }
inline cudaError_t cudaPeekAtLastError() { return cuda_sim::last_error(); }
inline const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        default: return "unknown error";
    }
}
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t = nullptr) { std::memset(p, v, n); return cudaSuccess; }
inline cudaError_t cudaMemset(void* p, int v, size_t n) { std::memset(p, v, n); return cudaSuccess; }
// no stream ever captures a graph here; device memory is host memory
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone, cudaStreamCaptureStatusActive };
inline cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* s) {
    *s = cudaStreamCaptureStatusNone; return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
// A small GPU: 2 SMs holding 2 blocks of any kernel each, so a grid sized by the GPU (rows in turn,
// whole waves) gives a block several rows here, and a 1 MiB L2, so that the cases here take the
// kernels' evict-first paths.
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrL2CacheSize = 38 };
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
    *value = attr == cudaDevAttrMultiProcessorCount ? 2 : attr == cudaDevAttrL2CacheSize ? 1 << 20 : 0;
    return cudaSuccess;
}
template <typename Kernel>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel, int, size_t) {
    *blocks = 2; return cudaSuccess;
}
inline cudaError_t cudaMalloc(void** p, size_t n) { *p = std::calloc(1, n); return *p ? cudaSuccess : cudaErrorInvalidValue; }
inline cudaError_t cudaFree(void* p) { std::free(p); return cudaSuccess; }
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t = nullptr) {
    std::memmove(d, s, n); return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) { std::memmove(d, s, n); return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

// ---- the built-in variables: set by the scheduler before it switches into a fiber -------
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

namespace cuda_sim {

[[noreturn]] void fail(const char* kind, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

struct Config { dim3 grid, block; size_t smem; cudaStream_t stream; };
inline Config config(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = nullptr) {
    return {grid, block, smem, stream};
}

// Runs body() once per thread of every block; defined in cuda_sim.cpp.
void run_launch(const char* kernel, const Config& cfg, void (*body)(void*), void* arg);
void* dynamic_shared();
// A __shared__ object (build.py's rewrite calls this after each declaration in a function):
// filled with 0xff bytes (NaN as float, -1 as an integer) when first seen and at the start
// of every block, so that reading shared memory no thread of the block wrote shows.
void shared_region(void* p, size_t bytes, const char* name = "");
// The calling thread updates the shared element at p (build.py wraps each update's lvalue in it).
void note_update(const void* p, size_t bytes, const char* file, int line);
template <typename T> inline T* update(T* p, const char* file, int line) {
    note_update(p, sizeof(T), file, line);
    return p;
}

template <typename Kernel, typename Tuple>
struct Bound {
    Kernel kernel;
    Tuple args;
    static void call(void* self) {
        auto* b = static_cast<Bound*>(self);
        std::apply(b->kernel, b->args);
    }
};

// The launch: arguments are converted to the kernel's parameter types once, on the host,
// as a real launch copies them; every thread then calls the kernel with them.
template <typename... Params, typename... Args>
void launch(const char* name, const Config& cfg, void (*kernel)(Params...), Args&&... args) {
    static_assert(sizeof...(Params) == sizeof...(Args), "kernel launched with the wrong number of arguments");
    using Tuple = std::tuple<std::decay_t<Params>...>;
    Bound<void (*)(Params...), Tuple> bound{kernel, Tuple(std::forward<Args>(args)...)};
    run_launch(name, cfg, &decltype(bound)::call, &bound);
}

// ---- synchronisation, implemented in cuda_sim.cpp ----------------------------------------
void syncthreads(const char* file, int line);
enum class Op { shfl_idx, shfl_up, shfl_down, shfl_xor, sync, ballot, any, all };
// One lane's part in a warp collective: returns the 8 bytes the collective gives this lane.
uint64_t warp_op(Op op, const char* name, const char* file, int line, unsigned mask, uint64_t value,
                 int arg, int width);

template <typename T>
inline T shuffle(Op op, const char* name, const char* file, int line, unsigned mask, T value, int arg, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type wider than 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    bits = warp_op(op, name, file, line, mask, bits, arg, width);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}

}  // namespace cuda_sim

#define __syncthreads() ::cuda_sim::syncthreads(__FILE__, __LINE__)
#define __threadfence() ((void)0)
#define __threadfence_block() ((void)0)
#define __shfl_sync(mask, v, lane, ...) ::cuda_sim::shuffle(::cuda_sim::Op::shfl_idx, "__shfl_sync", __FILE__, \
    __LINE__, mask, v, lane, ::cuda_sim::width_or_32(__VA_ARGS__))
#define __shfl_up_sync(mask, v, d, ...) ::cuda_sim::shuffle(::cuda_sim::Op::shfl_up, "__shfl_up_sync", __FILE__, \
    __LINE__, mask, v, d, ::cuda_sim::width_or_32(__VA_ARGS__))
#define __shfl_down_sync(mask, v, d, ...) ::cuda_sim::shuffle(::cuda_sim::Op::shfl_down, "__shfl_down_sync", \
    __FILE__, __LINE__, mask, v, d, ::cuda_sim::width_or_32(__VA_ARGS__))
#define __shfl_xor_sync(mask, v, m, ...) ::cuda_sim::shuffle(::cuda_sim::Op::shfl_xor, "__shfl_xor_sync", \
    __FILE__, __LINE__, mask, v, m, ::cuda_sim::width_or_32(__VA_ARGS__))
#define __syncwarp(...) ((void)::cuda_sim::warp_op(::cuda_sim::Op::sync, "__syncwarp", __FILE__, __LINE__, \
    ::cuda_sim::mask_or_full(__VA_ARGS__), 0, 0, 32))
#define __ballot_sync(mask, pred) unsigned(::cuda_sim::warp_op(::cuda_sim::Op::ballot, "__ballot_sync", __FILE__, \
    __LINE__, mask, (pred) ? 1 : 0, 0, 32))
#define __any_sync(mask, pred) int(::cuda_sim::warp_op(::cuda_sim::Op::any, "__any_sync", __FILE__, __LINE__, \
    mask, (pred) ? 1 : 0, 0, 32))
#define __all_sync(mask, pred) int(::cuda_sim::warp_op(::cuda_sim::Op::all, "__all_sync", __FILE__, __LINE__, \
    mask, (pred) ? 1 : 0, 0, 32))

namespace cuda_sim {
inline int width_or_32() { return 32; }
inline int width_or_32(int w) { return w; }
inline unsigned mask_or_full() { return 0xffffffffu; }
inline unsigned mask_or_full(unsigned m) { return m; }
unsigned active_mask();
}  // namespace cuda_sim
#define __activemask() ::cuda_sim::active_mask()

// ---- atomics: fibers never switch inside one, so a plain update is atomic ---------------
template <typename T> inline T atomicAdd(T* p, T v) { T old = *p; *p = old + v; return old; }
template <typename T> inline T atomicSub(T* p, T v) { T old = *p; *p = old - v; return old; }
template <typename T> inline T atomicMax(T* p, T v) { T old = *p; *p = old < v ? v : old; return old; }
template <typename T> inline T atomicMin(T* p, T v) { T old = *p; *p = v < old ? v : old; return old; }
template <typename T> inline T atomicExch(T* p, T v) { T old = *p; *p = v; return old; }
template <typename T> inline T atomicCAS(T* p, T cmp, T v) { T old = *p; if (old == cmp) *p = v; return old; }
inline unsigned atomicInc(unsigned* p, unsigned v) { unsigned old = *p; *p = old >= v ? 0u : old + 1u; return old; }
// cache-hinted loads (__ldcg: through L2 only; __ldcs: evict-first) read memory as any load does here, and
// stores (__stwb) write it
template <typename T> inline T __ldcg(const T* p) { return *p; }
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline void __stwb(T* p, T v) { *p = v; }
