// Stand-in for <cuda_bf16.h> under the CPU simulator: cuda_sim.h (included first, by g++ -include)
// declares what the exercises use.
#pragma once
#include "../cuda_sim.h"
