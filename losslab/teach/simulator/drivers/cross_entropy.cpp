// cross_entropy's driver: runs the custom forward (which also counts the targets) and, where
// the source defines it, the custom backward on each case of the manifest.
//
// Manifest case line: name N C offset grad_loss input_path
// (the input file holds offset + N*C float32 logits, then N int64 targets).
// Outputs per case i: i.loss.bin (1 float), i.rows.bin (N row losses), i.row_max.bin,
// i.row_log_sum.bin (N floats each: NaN where the forward wrote nothing), i.counts.bin
// (2 int64: n_valid, out of range), i.grad.bin (N*C floats) with a backward.
// The launcher types are launchers.h's, so a change of the contract fails this build.
#include "driver.h"
#include "cross_entropy/launchers.h"

cross_entropy_forward_fn cross_entropy_custom_forward;
cross_entropy_backward_fn cross_entropy_custom_backward __attribute__((weak));  // optional

int main(int argc, char** argv) {
    if (argc != 4) { std::fprintf(stderr, "usage: driver manifest outdir first_case\n"); return 4; }
    driver::install_handlers();
    FILE* manifest = std::fopen(argv[1], "r");
    if (!manifest) { std::perror(argv[1]); return 4; }
    const std::string out = argv[2];
    const int first = std::atoi(argv[3]);
    int cases = 0;
    if (std::fscanf(manifest, "%d", &cases) != 1) return 4;
    for (int i = 0; i < cases; ++i) {
        char name[128], path[4096];
        long long N, C, off;
        float grad_loss;
        if (std::fscanf(manifest, "%127s %lld %lld %lld %f %4095s", name, &N, &C, &off, &grad_loss, path) != 6)
            return 4;
        if (i < first) continue;
        driver::event("{\"event\": \"case_begin\", \"case\": " + std::to_string(i) + "}");
        driver::start_clock();
        float* x = driver::allocate<float>(N * C, off, "logits", i);
        int64_t* targets = driver::allocate<int64_t>(N, 0, "targets", i);
        int64_t* counts = driver::allocate<int64_t>(4, 0, "counts", i);  // the last two: the launcher's scratch
        float* rows = driver::allocate<float>(N, 0, "row_losses", i);
        float* row_max = driver::allocate<float>(N, 0, "row_max", i);
        float* row_log_sum = driver::allocate<float>(N, 0, "row_log_sum", i);
        float* loss = driver::allocate<float>(1, 0, "loss", i);
        float* grad = driver::allocate<float>(N * C, 0, "grad_logits", i);
        float* g = driver::allocate<float>(1, 0, "grad_loss", i);
        FILE* in = std::fopen(path, "rb");
        if (!in) { std::perror(path); return 4; }
        driver::read_into(in, x - off, off + N * C);
        driver::read_into(in, targets, N);
        std::fclose(in);
        for (float* buf : {rows, row_max, row_log_sum}) driver::fill_nan(buf, N);
        driver::fill_nan(loss, 1);
        driver::fill_nan(grad, N * C);
        *g = grad_loss;
        cuda_sim::last_error() = cudaSuccess;
        const int fwd = int(cross_entropy_custom_forward(x, targets, counts, rows, row_max, row_log_sum, loss, grad, N,
                                                         C, DType::float32, nullptr));
        driver::write_output(out, i, "loss", loss, 1);
        driver::write_output(out, i, "rows", rows, N);
        driver::write_output(out, i, "row_max", row_max, N);
        driver::write_output(out, i, "row_log_sum", row_log_sum, N);
        driver::write_output(out, i, "counts", counts, 2);
        int bwd = -1;
        if (cross_entropy_custom_backward && fwd == 0) {
            bwd = int(cross_entropy_custom_backward(x, targets, row_max, row_log_sum, counts, g, grad, N, C,
                                                    DType::float32, nullptr));
            driver::write_output(out, i, "grad", grad, N * C);
        }
        driver::event("{\"event\": \"case_end\", \"case\": " + std::to_string(i) + ", \"forward_status\": " +
                      std::to_string(fwd) + ", \"backward_status\": " + std::to_string(bwd) + "}");
        driver::release(x, off);
        for (void* buf : {static_cast<void*>(targets), static_cast<void*>(counts), static_cast<void*>(rows),
                          static_cast<void*>(row_max), static_cast<void*>(row_log_sum), static_cast<void*>(loss),
                          static_cast<void*>(grad), static_cast<void*>(g)})
            std::free(buf);
    }
    return 0;
}
