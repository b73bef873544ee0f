// The guarded CPU device (backend/Device.h, makeGuardedCpuDevice): its memory reaches the
// host through its copies only, and a read of it from anywhere else ends the process with
// its message; its kernels are the CPU's.
#include "backend/Device.h"

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdio>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

TEST_CASE("the guarded device: its memory through its copies, and nowhere else") {
  auto dev = epl::backend::makeGuardedCpuDevice(1);
  CHECK_FALSE(dev->hostAddressable());
  CHECK(dev->name().rfind("cpu", 0) == 0);
  CHECK(dev->name().find("guarded") != std::string::npos);
  std::vector<float> in{1, 2, 3, 4}, out(4, 0.f);
  auto* p = static_cast<float*>(dev->allocate(16));
  dev->copyToDevice(p, in.data(), 16);
  // A kernel of the CPU device on it: scale in place.
  epl::backend::TensorView view;
  view.data = p;
  view.shape = {4};
  view.dtype = epl::ir::DType::F32;
  dev->scale(view, 2.f);
  dev->copyToHost(out.data(), p, 16);
  CHECK(out == std::vector<float>{2, 4, 6, 8});

  // The host reading it directly, in a child: a segmentation fault, said as such.
  int pipes[2];
  REQUIRE(pipe(pipes) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    dup2(pipes[1], STDERR_FILENO);
    volatile float seen = p[0]; // the fault
    (void)seen;
    _exit(0);
  }
  close(pipes[1]);
  std::string said;
  char buf[512];
  for (ssize_t n; (n = read(pipes[0], buf, sizeof buf)) > 0;)
    said.append(buf, static_cast<size_t>(n));
  close(pipes[0]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
  CHECK(said.find("EPL_GUARD_DEVICE: a segmentation fault") != std::string::npos);
  dev->release(p);
}
