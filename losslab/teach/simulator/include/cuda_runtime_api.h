// Stand-in for <cuda_runtime_api.h> under the CPU simulator: cuda_sim.h (included first, by g++ -include)
// declares what the exercises use.
#pragma once
#include "../cuda_sim.h"
