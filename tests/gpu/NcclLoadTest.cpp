// NCCL opened at run time (backend/cuda/Nccl.h): it needs the library, not a GPU, so these
// run on any machine that built the CUDA device.
#include "backend/cuda/Nccl.h"

#include <algorithm>
#include <catch2/catch.hpp>

using epl::backend::cuda::NcclApi;
using epl::backend::cuda::openNccl;

TEST_CASE("nccl: this build's library opens without a GPU, every entry point resolved") {
  std::string why;
  const NcclApi* api = epl::backend::cuda::nccl(&why);
  INFO(why);
  REQUIRE(api);
  CHECK(why.empty());
  for (bool resolved :
       {!!api->getVersion, !!api->getUniqueId, !!api->commInitRank, !!api->commDestroy,
        !!api->commAbort, !!api->commGetAsyncError, !!api->errorString, !!api->allReduce,
        !!api->reduceScatter, !!api->reduce, !!api->allGather, !!api->broadcast, !!api->send,
        !!api->recv, !!api->groupStart, !!api->groupEnd})
    CHECK(resolved);
  // The version of the library, as major.minor.patch: 2.x.
  std::string version = epl::backend::cuda::ncclVersionText(*api);
  CHECK(version.rfind("2.", 0) == 0);
  CHECK(std::count(version.begin(), version.end(), '.') == 2);
  CHECK(std::string(api->errorString(ncclInvalidUsage)).find("invalid usage") != std::string::npos);
}

TEST_CASE("nccl: a library that is missing, or is not NCCL, says which and why") {
  NcclApi api;
  std::string missing = openNccl("libepl-no-such-nccl.so.2", api);
  CHECK(missing.find("libepl-no-such-nccl.so.2") != std::string::npos);
  CHECK(openNccl("libz.so.1", api) == "libz.so.1: it has no `ncclGetVersion`");
}
