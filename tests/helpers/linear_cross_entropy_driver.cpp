// The linear cross-entropy's kernel (kernels/linear_cross_entropy/rows.cu) on the CPU simulator
// (losslab/teach/simulator/cuda_sim.h), for tests/test_linear_cross_entropy.py:
//   driver rows V dtype ignore_index label_smoothing softcap mean write_grad has_weight has_row_scale in.bin out/
// in.bin: rows * V logits of dtype, rows int64 targets, V float32 weights (if any), 2 float32 stats,
// rows float32 row scales (if any). Writes out/losses.bin (rows float32) and out/logits.bin (the
// chunk after the kernel: dloss/dlogits where write_grad). The launcher's type is launchers.h's.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <string>
#include "linear_cross_entropy/launchers.h"
int main(int argc, char** argv) {
    long long rows = atoll(argv[1]), V = atoll(argv[2]); int dtype = atoi(argv[3]); long long ii = atoll(argv[4]);
    float eps = atof(argv[5]), cap = atof(argv[6]); int mean = atoi(argv[7]), wg = atoi(argv[8]);
    int hw = atoi(argv[9]), hs = atoi(argv[10]);
    std::string in = argv[11], out = argv[12];
    size_t es = dtype == 0 ? 4 : 2;
    FILE* f = fopen(in.c_str(), "rb");
    if (!f) return 4;
    std::vector<char> logits(rows * V * es + 64);
    char* lp = logits.data() + (16 - (reinterpret_cast<uintptr_t>(logits.data()) % 16)) % 16;  // as cudaMalloc's
    std::vector<int64_t> t(rows);
    std::vector<float> w(V), stats(2), sc(rows);
    bool read = fread(lp, es, rows * V, f) == size_t(rows * V) && fread(t.data(), 8, rows, f) == size_t(rows);
    read = read && (!hw || fread(w.data(), 4, V, f) == size_t(V)) && fread(stats.data(), 4, 2, f) == 2;
    read = read && (!hs || fread(sc.data(), 4, rows, f) == size_t(rows));
    fclose(f);
    if (!read) return 4;
    std::vector<float> losses(rows);
    cudaError_t e = linear_cross_entropy_rows(lp, t.data(), hw ? w.data() : nullptr, stats.data(), hs ? sc.data() : nullptr,
                                             losses.data(), rows, V, ii, eps, cap, mean, wg, static_cast<DType>(dtype), nullptr);
    if (e != cudaSuccess) { fprintf(stderr, "error %d\n", int(e)); return 5; }
    f = fopen((out + "/losses.bin").c_str(), "wb"); fwrite(losses.data(), 4, rows, f); fclose(f);
    f = fopen((out + "/logits.bin").c_str(), "wb"); fwrite(lp, es, rows * V, f); fclose(f);
    return 0;
}
