// hinge_loss's driver: runs the custom launchers (hinge_loss_custom_forward and, where the
// source defines it, hinge_loss_custom_backward) on each case of the manifest.
//
// Manifest case line: name B D offset_p offset_t grad_loss input_path
// (the input file holds offset_p + B*D predictions, then offset_t + D targets, float32).
// Outputs per case i: i.loss.bin (1 float), i.rows.bin (the first B partials as the
// forward left them, NaN where it wrote nothing), i.grad.bin (B*D floats) with a backward.
// The launcher types are launchers.h's, so a change of the contract fails this build
// rather than calling the participant's launchers with the wrong arguments.
#include <algorithm>
#include "driver.h"
#include "hinge_loss/launchers.h"

hinge_loss_forward_fn hinge_loss_custom_forward;
hinge_loss_backward_fn hinge_loss_custom_backward __attribute__((weak));  // optional: null where not defined

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
        long long B, D, op, ot;
        float grad_loss;
        if (std::fscanf(manifest, "%127s %lld %lld %lld %lld %f %4095s", name, &B, &D, &op, &ot, &grad_loss, path) != 7)
            return 4;
        if (i < first) continue;
        driver::event("{\"event\": \"case_begin\", \"case\": " + std::to_string(i) + "}");
        driver::start_clock();
        const long long scratch = std::max<long long>(B, HINGE_LOSS_MAX_PARTIALS) + 4;  // launchers.h's contract
        float* p = driver::allocate<float>(B * D, op, "predictions", i);
        float* t = driver::allocate<float>(D, ot, "targets", i);
        float* partials = driver::allocate<float>(scratch, 0, "partials", i);
        float* loss = driver::allocate<float>(1, 0, "loss", i);
        FILE* in = std::fopen(path, "rb");
        if (!in) { std::perror(path); return 4; }
        driver::read_into(in, p - op, op + B * D);
        driver::read_into(in, t - ot, ot + D);
        std::fclose(in);
        driver::fill_nan(partials, scratch);
        driver::fill_nan(loss, 1);
        // A rung that fuses the gradient into its forward writes it there (and requires it);
        // the others ignore it and their backward writes it.
        float* grad = driver::allocate<float>(B * D, 0, "grad_predictions", i);
        float* g = driver::allocate<float>(1, 0, "grad_loss", i);
        *g = grad_loss;
        driver::fill_nan(grad, B * D);
        cuda_sim::last_error() = cudaSuccess;
        const int fwd = int(hinge_loss_custom_forward(p, t, partials, loss, grad, B, D, DType::float32, nullptr));
        driver::write_output(out, i, "loss", loss, 1);
        driver::write_output(out, i, "rows", partials, B);
        int bwd = -1;
        if (hinge_loss_custom_backward && fwd == 0) {
            bwd = int(hinge_loss_custom_backward(p, t, g, grad, B, D, DType::float32, nullptr));
            driver::write_output(out, i, "grad", grad, B * D);
        }
        driver::release(g, 0);
        driver::release(grad, 0);
        driver::event("{\"event\": \"case_end\", \"case\": " + std::to_string(i) + ", \"forward_status\": " +
                      std::to_string(fwd) + ", \"backward_status\": " + std::to_string(bwd) + "}");
        driver::release(p, op);
        driver::release(t, ot);
        driver::release(partials, 0);
        driver::release(loss, 0);
    }
    return 0;
}
