// Zeroed device words a one-kernel reduction needs (its ticket, integer counters)
// without a memset per call: each (device, stream) gets its own 32 bytes, zeroed
// once, and every kernel that uses them leaves them zero again (the ticket wraps
// to 0 with atomicInc; the last block zeroes the counters it read). Calls on one
// stream run in order, so they never share the words at the same time. A memset
// is a second operation on the stream: a few microseconds of host time per call,
// and at small sizes a visible share of the GPU time too.
//
// While the stream captures a CUDA graph the words come from the call's own
// scratch instead, zeroed with cudaMemsetAsync (a memset node the graph owns): a
// graph may be replayed on another stream, alongside the capture stream's calls.
#pragma once
#include <cstddef>
#include <cuda_runtime.h>

constexpr size_t STREAM_WORKSPACE_BYTES = 32;

// *words = the current device's zeroed words for `stream` (allocated at its first
// use), or, while `stream` is capturing, `fallback` after a memset of its first
// `bytes` (<= STREAM_WORKSPACE_BYTES) on `stream`.
cudaError_t stream_workspace(cudaStream_t stream, void* fallback, size_t bytes, void** words);
