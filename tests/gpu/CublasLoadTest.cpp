// cuBLAS opened at run time (backend/cuda/Cublas.h): it needs the library, not a GPU, so
// these run on any machine that built the CUDA device.
#include "backend/cuda/Cublas.h"

#include <catch2/catch.hpp>

using epl::backend::cuda::CublasApi;
using epl::backend::cuda::openCublas;

TEST_CASE("cublas: this build's library opens without a GPU, every entry point resolved") {
  const CublasApi& api = epl::backend::cuda::cublas();
  CHECK(api.create);
  CHECK(api.destroy);
  CHECK(api.setStream);
  CHECK(api.setMathMode);
  CHECK(api.getVersion);
  CHECK(api.statusString);
  CHECK(api.gemmEx);
  CHECK(api.gemmStridedBatchedEx);
  CHECK(std::string(api.statusString(CUBLAS_STATUS_NOT_INITIALIZED)).find("not initialized") !=
        std::string::npos);
}

TEST_CASE("cublas: a library that is missing, or is not cuBLAS, says which and why") {
  CublasApi api;
  std::string missing = openCublas("libepl-no-such-cublas.so.1", api);
  CHECK(missing.find("libepl-no-such-cublas.so.1") != std::string::npos);
  std::string other = openCublas("libz.so.1", api);
  CHECK(other == "libz.so.1: it has no `cublasCreate_v2`");
}
