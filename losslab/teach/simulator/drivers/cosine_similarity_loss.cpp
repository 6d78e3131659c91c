// cosine_similarity_loss's driver: runs the custom launchers (cosine_similarity_loss_custom_forward
// and, where the source defines it, _backward) on each case of the manifest, eps = 1e-8.
//
// Manifest case line: name B D offset_p offset_t grad_loss input_path
// (the input file holds offset_p + B*D predictions, then offset_t + B*D targets, float32).
// Outputs per case i: i.loss.bin (1 float), i.rows.bin (B floats: row_partials as the forward
// left them), i.row_dots.bin (3B floats: NaN where the forward wrote nothing), i.grad.bin (B*D
// floats) with a backward. The launcher types are launchers.h's, so a change of the contract
// fails this build rather than calling the participant's launchers with the wrong arguments.
#include "driver.h"
#include "cosine_similarity_loss/launchers.h"

cosine_similarity_loss_forward_fn cosine_similarity_loss_custom_forward;
cosine_similarity_loss_backward_fn cosine_similarity_loss_custom_backward __attribute__((weak));  // optional

int main(int argc, char** argv) {
    if (argc != 4) { std::fprintf(stderr, "usage: driver manifest outdir first_case\n"); return 4; }
    driver::install_handlers();
    FILE* manifest = std::fopen(argv[1], "r");
    if (!manifest) { std::perror(argv[1]); return 4; }
    const std::string out = argv[2];
    const int first = std::atoi(argv[3]);
    const float eps = 1e-8f;
    int cases = 0;
    if (std::fscanf(manifest, "%d", &cases) != 1) return 4;
    for (int i = 0; i < cases; ++i) {
        char name[128], path[4096];
        long long B, D, op, ot;
        float grad_loss;
        if (std::fscanf(manifest, "%127s %lld %lld %lld %lld %f %4095s", name, &B, &D, &op, &ot, &grad_loss, path) != 7)
            return 4;
        if (i < first) continue;
        driver::event("{\"event\": \"case_begin\", \"case\": " + std::to_string(i) + "}");
        driver::start_clock();
        float* p = driver::allocate<float>(B * D, op, "predictions", i);
        float* t = driver::allocate<float>(B * D, ot, "targets", i);
        float* dots = driver::allocate<float>(3 * B, 0, "row_dots", i);
        float* rows = driver::allocate<float>(B + 4, 0, "row_partials", i);  // the last 4: the launcher's scratch
        float* loss = driver::allocate<float>(1, 0, "loss", i);
        FILE* in = std::fopen(path, "rb");
        if (!in) { std::perror(path); return 4; }
        driver::read_into(in, p - op, op + B * D);
        driver::read_into(in, t - ot, ot + B * D);
        std::fclose(in);
        driver::fill_nan(dots, 3 * B);
        driver::fill_nan(rows, B + 4);
        driver::fill_nan(loss, 1);
        // A rung that fuses the gradient into its forward writes it there (and requires it);
        // the others ignore it and their backward writes it.
        float* grad = driver::allocate<float>(B * D, 0, "grad_predictions", i);
        float* g = driver::allocate<float>(1, 0, "grad_loss", i);
        *g = grad_loss;
        driver::fill_nan(grad, B * D);
        cuda_sim::last_error() = cudaSuccess;
        const int fwd = int(cosine_similarity_loss_custom_forward(p, t, dots, rows, loss, grad, nullptr, B, D, eps,
                                                                  DType::float32, nullptr));
        driver::write_output(out, i, "loss", loss, 1);
        driver::write_output(out, i, "rows", rows, B);
        driver::write_output(out, i, "row_dots", dots, 3 * B);
        int bwd = -1;
        if (cosine_similarity_loss_custom_backward && fwd == 0) {
            bwd = int(cosine_similarity_loss_custom_backward(p, t, dots, g, grad, nullptr, B, D, eps, DType::float32,
                                                             nullptr));
            driver::write_output(out, i, "grad", grad, B * D);
        }
        driver::release(g, 0);
        driver::release(grad, 0);
        driver::event("{\"event\": \"case_end\", \"case\": " + std::to_string(i) + ", \"forward_status\": " +
                      std::to_string(fwd) + ", \"backward_status\": " + std::to_string(bwd) + "}");
        driver::release(p, op);
        driver::release(t, ot);
        driver::release(dots, 0);
        driver::release(rows, 0);
        driver::release(loss, 0);
    }
    return 0;
}
