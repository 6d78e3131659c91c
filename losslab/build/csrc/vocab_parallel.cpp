// Python binding of the vocabulary-parallel cross-entropy's three launchers
// (kernels/vocab_parallel/launchers.h), through bind.h: pointers, sizes and the dtype
// code as integers, the stream last. Built by build.load_extension("vocab_parallel").
#include "bind.h"
#include "vocab_parallel/launchers.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "losslab vocab_parallel: per-row statistics of a vocabulary slice, their "
              "combination over the ranks, and the slice's gradient";
    losslab::bind(m, "statistics", &vocab_parallel_statistics);
    losslab::bind(m, "combine", &vocab_parallel_combine);
    losslab::bind(m, "gradient", &vocab_parallel_gradient);
}
