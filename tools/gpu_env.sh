# Sourced on a GPU machine by tools/gpu_check.sh and the GPU benchmarks, from the
# repository's root: the bundle's libraries (tools/gpu_bundle.sh) and cuBLAS and NCCL from
# python3's `nvidia` packages on the library path, and the standard library where `epl` finds it.
root=$PWD
libs=$root/.gpu/lib
for dir in $(python3 - <<'PY'
import glob, os, site
for base in site.getsitepackages():
    for name in ("libcublas*.so*", "libnccl*.so*"):
        for lib in glob.glob(os.path.join(base, "nvidia", "**", name), recursive=True):
            print(os.path.dirname(lib))
PY
); do libs=$libs:$dir; done
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export EPL_STDLIB=$root/stdlib
