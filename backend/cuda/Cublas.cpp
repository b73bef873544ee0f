// See Cublas.h.
#include "backend/cuda/Cublas.h"
#include "backend/Device.h"
#include "backend/cuda/Library.h"

#include <fmt/format.h>

namespace epl::backend::cuda {

std::string openCublas(const std::string& library, CublasApi& api) {
  std::string error;
  void* lib = openLibrary(library, error);
  if (!lib) return error;
  resolve(lib, "cublasCreate_v2", api.create, error);
  resolve(lib, "cublasDestroy_v2", api.destroy, error);
  resolve(lib, "cublasSetStream_v2", api.setStream, error);
  resolve(lib, "cublasSetMathMode", api.setMathMode, error);
  resolve(lib, "cublasGetVersion_v2", api.getVersion, error);
  resolve(lib, "cublasGetStatusString", api.statusString, error);
  resolve(lib, "cublasGemmEx_64", api.gemmEx, error);
  resolve(lib, "cublasGemmStridedBatchedEx_64", api.gemmStridedBatchedEx, error);
  return error.empty() ? error : fmt::format("{}: {}", library, error);
}

const CublasApi& cublas() {
  struct Loaded {
    CublasApi api;
    std::string error;
  };
  static const Loaded loaded = [] {
    Loaded l;
    const std::string name = "libcublas.so." EPL_CUBLAS_MAJOR;
    l.error = openCublas(name, l.api);
    // The toolkit this build found, for a machine whose library path lacks it.
    if (!l.error.empty() && openCublas(EPL_CUBLAS_DIR "/" + name, l.api).empty()) l.error.clear();
    return l;
  }();
  if (!loaded.error.empty())
    throw DeviceUnavailable(
        fmt::format("the GPU needs cuBLAS, which could not be loaded ({}); put the directory of "
                    "libcublas.so.{} on LD_LIBRARY_PATH, or use --device cpu",
                    loaded.error, EPL_CUBLAS_MAJOR));
  return loaded.api;
}

} // namespace epl::backend::cuda
