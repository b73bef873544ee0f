// conv2d through oneDNN's direct convolution (backend/cpu/ConvDirect.cpp), where the build
// has oneDNN; Conv.cpp's im2col + GEMM otherwise, or under EPL_CPU_CONV=im2col.
#pragma once
#include "backend/KernelArgs.h"

namespace epl::backend::cpu {

// Runs the conv2d call (forward or backward) and returns true, or returns false, touching
// nothing, where this path is not taken.
bool convDirect(const KernelCall& c, bool hasBias);
// Whether conv2d can take this path here: a build with oneDNN, and not EPL_CPU_CONV=im2col.
bool convDirectInUse();

} // namespace epl::backend::cpu
