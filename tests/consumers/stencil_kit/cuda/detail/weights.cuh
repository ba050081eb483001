#pragma once
#include "scale.cuh"  // next to this file: cuda/detail/scale.cuh

__device__ inline float box_weight(int radius) { return unit_scale() / (2 * radius + 1); }
