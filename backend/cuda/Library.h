// Opening a GPU library at run time rather than linking it (Cublas.h, Nccl.h): a binary
// that starts where the library is missing, and pays for loading it only where it is used.
#pragma once
#include <dlfcn.h>
#include <fmt/format.h>
#include <string>

namespace epl::backend::cuda {

// dlopen(name) for the whole process's lifetime; null with `error` the loader's reason.
inline void* openLibrary(const std::string& name, std::string& error) {
  void* lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = ::dlerror();
    error = why ? why : "the dynamic loader gave no reason";
  }
  return lib;
}

// fn = the library's `symbol`; `error` names the first one missing (later ones are not
// looked up).
template <typename Fn> void resolve(void* lib, const char* symbol, Fn& fn, std::string& error) {
  if (!error.empty()) return;
  fn = reinterpret_cast<Fn>(::dlsym(lib, symbol));
  if (!fn) error = fmt::format("it has no `{}`", symbol);
}

} // namespace epl::backend::cuda
