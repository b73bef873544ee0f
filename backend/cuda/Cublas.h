// cuBLAS, opened on first use rather than linked: loading it (with cuBLASLt, which it
// pulls in) costs every process about 0.2 s and 215 MB of resident memory before main,
// GPU or not, and a linked binary would not start where the library is missing. The CUDA
// device opens it when it is made (docs/gpu.md, "Building").
#pragma once
#include <cublas_v2.h>

#include <string>

namespace epl::backend::cuda {

// The cuBLAS entry points the CUDA device calls, resolved from the loaded library.
struct CublasApi {
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasDestroy_v2) destroy = nullptr;
  decltype(&::cublasSetStream_v2) setStream = nullptr;
  decltype(&::cublasSetMathMode) setMathMode = nullptr;
  decltype(&::cublasGetVersion_v2) getVersion = nullptr;
  decltype(&::cublasGetStatusString) statusString = nullptr;
  decltype(&::cublasGemmEx_64) gemmEx = nullptr;
  decltype(&::cublasGemmStridedBatchedEx_64) gemmStridedBatchedEx = nullptr;
};

// Opens `library` (a name the dynamic loader searches for, or a path) and resolves every
// entry point into `api`. Returns an empty string, or why it could not: the loader's
// message, or the first symbol missing. A library once opened stays open.
std::string openCublas(const std::string& library, CublasApi& api);

// The process's cuBLAS: this build's CUDA major version of libcublas, from the library
// path, else from the toolkit this build found. Throws DeviceUnavailable saying which
// library it looked for and why it failed. Opened once; later calls return it.
const CublasApi& cublas();

} // namespace epl::backend::cuda
