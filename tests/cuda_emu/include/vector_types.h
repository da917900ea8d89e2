// CUDA emulation (TFRING_WITH_CUDA=EMU): the CUDA vector types the product
// code uses, laid out as CUDA lays them out. See tests/cuda_emu/README.md.
#pragma once

struct uint3 {
  unsigned int x, y, z;
};

struct alignas(8) uint2 {
  unsigned int x, y;
};

struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
};
