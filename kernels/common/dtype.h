// The element types a launcher can be asked for, as the binding passes them
// (plain C++: included by the torch-free bindings and by the kernels).
#pragma once

enum class DType : int { float32 = 0, bfloat16 = 1, float16 = 2 };
