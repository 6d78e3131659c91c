// triplet_margin_loss's driver: runs the custom launchers (triplet_margin_loss_custom_forward and,
// where the source defines it, triplet_margin_loss_custom_backward) on each case of the manifest.
//
// Manifest case line: name B D offset_a offset_p offset_n grad_loss input_path
// (the input file holds offset_a + B*D anchor, offset_p + B*D positive, then offset_n + B*D
// negative elements, float32). Outputs per case i: i.loss.bin (1 float), i.rows.bin (B floats:
// row_losses as the forward left them), i.grad.bin (B*D floats: dL/danchor) with a backward.
// The launcher types are launchers.h's, so a change of the contract fails this build.
#include "driver.h"
#include "triplet_margin_loss/launchers.h"

triplet_margin_loss_forward_fn triplet_margin_loss_custom_forward;
triplet_margin_loss_backward_fn triplet_margin_loss_custom_backward __attribute__((weak));  // optional

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
        long long B, D, oa, op, on;
        float grad_loss;
        if (std::fscanf(manifest, "%127s %lld %lld %lld %lld %lld %f %4095s", name, &B, &D, &oa, &op, &on, &grad_loss,
                        path) != 8)
            return 4;
        if (i < first) continue;
        driver::event("{\"event\": \"case_begin\", \"case\": " + std::to_string(i) + "}");
        driver::start_clock();
        float* a = driver::allocate<float>(B * D, oa, "anchor", i);
        float* p = driver::allocate<float>(B * D, op, "positive", i);
        float* n = driver::allocate<float>(B * D, on, "negative", i);
        float* rows = driver::allocate<float>(B + 4, 0, "row_losses", i);  // the last 4: the launcher's scratch
        float* loss = driver::allocate<float>(1, 0, "loss", i);
        FILE* in = std::fopen(path, "rb");
        if (!in) { std::perror(path); return 4; }
        driver::read_into(in, a - oa, oa + B * D);
        driver::read_into(in, p - op, op + B * D);
        driver::read_into(in, n - on, on + B * D);
        std::fclose(in);
        driver::fill_nan(rows, B + 4);
        driver::fill_nan(loss, 1);
        // A rung that fuses the gradient into its forward writes it there (and requires it);
        // the others ignore it and their backward writes it.
        float* grad = driver::allocate<float>(B * D, 0, "grad_anchor", i);
        float* g = driver::allocate<float>(1, 0, "grad_loss", i);
        *g = grad_loss;
        driver::fill_nan(grad, B * D);
        cuda_sim::last_error() = cudaSuccess;
        const int fwd = int(triplet_margin_loss_custom_forward(a, p, n, rows, loss, grad, B, D, DType::float32,
                                                               nullptr));
        driver::write_output(out, i, "loss", loss, 1);
        driver::write_output(out, i, "rows", rows, B);
        int bwd = -1;
        if (triplet_margin_loss_custom_backward && fwd == 0) {
            bwd = int(triplet_margin_loss_custom_backward(a, p, n, g, grad, B, D, DType::float32, nullptr));
            driver::write_output(out, i, "grad", grad, B * D);
        }
        driver::release(g, 0);
        driver::release(grad, 0);
        driver::event("{\"event\": \"case_end\", \"case\": " + std::to_string(i) + ", \"forward_status\": " +
                      std::to_string(fwd) + ", \"backward_status\": " + std::to_string(bwd) + "}");
        driver::release(a, oa);
        driver::release(p, op);
        driver::release(n, on);
        driver::release(rows, 0);
        driver::release(loss, 0);
    }
    return 0;
}
