// stream_workspace.cuh: the words, one allocation per (device, stream), kept for the process.
#include <map>
#include <mutex>
#include <utility>
#include "common/stream_workspace.cuh"

cudaError_t stream_workspace(cudaStream_t stream, void* fallback, size_t bytes, void** words) {
    if (bytes > STREAM_WORKSPACE_BYTES) return cudaErrorInvalidValue;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cudaError_t err = cudaStreamIsCapturing(stream, &capture);
    if (err != cudaSuccess) return err;
    if (capture != cudaStreamCaptureStatusNone) {
        *words = fallback;
        return cudaMemsetAsync(fallback, 0, bytes, stream);
    }
    int device = 0;
    if ((err = cudaGetDevice(&device)) != cudaSuccess) return err;
    static std::mutex mutex;
    static std::map<std::pair<int, cudaStream_t>, void*> allocated;
    const std::lock_guard<std::mutex> lock(mutex);
    void*& found = allocated[{device, stream}];
    if (found == nullptr) {
        void* fresh = nullptr;
        if ((err = cudaMalloc(&fresh, STREAM_WORKSPACE_BYTES)) != cudaSuccess) return err;
        // on `stream`, so ordered before the kernel that first uses it
        if ((err = cudaMemsetAsync(fresh, 0, STREAM_WORKSPACE_BYTES, stream)) != cudaSuccess) {
            cudaFree(fresh);
            return err;
        }
        found = fresh;
    }
    *words = found;
    return cudaSuccess;
}
