// Python binding of the linear cross-entropy's kernel (launchers.h), through losslab/build/csrc/bind.h:
// pointers, sizes and the dtype code as integers, the stream last. It lives here, not in
// losslab/build/csrc/, because every file there is hashed into each problem's recorded results
// (losslab.records.freshness): this operator is no problem of the records.
#include "bind.h"
#include "common/scale.cuh"
#include "linear_cross_entropy/launchers.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "losslab linear_cross_entropy kernels: rows(...) on one chunk of logits, scale_in_place(...)";
    losslab::bind(m, "rows", &linear_cross_entropy_rows);
    losslab::bind(m, "scale_in_place", &scale_in_place);  // the backward of mean/sum: grads *= grad_output
}
