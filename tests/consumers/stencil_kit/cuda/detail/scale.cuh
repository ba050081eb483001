#pragma once
__device__ inline float unit_scale() { return 1.0f; }
