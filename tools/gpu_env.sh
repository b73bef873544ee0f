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
# The bundle's Open MPI, relocated: mpirun on the path, its components found under
# OPAL_PREFIX, PMIx's under its own prefix; as root, and over shared memory and TCP only.
mpi=$root/.gpu/mpi/usr
if [ -d "$mpi" ]; then
  pmix=$mpi/lib/x86_64-linux-gnu/pmix2
  libs=$libs:$mpi/lib/x86_64-linux-gnu/openmpi/lib:$pmix/lib
  export PATH=$mpi/bin:$PATH OPAL_PREFIX=$mpi PMIX_INSTALL_PREFIX=$pmix
  export PMIX_MCA_mca_base_component_path=$pmix/lib/pmix
  # Its zlib component does not load there (a symbol of the PMIx it was built with):
  # without compression, a warning on every launch that says nothing about the run.
  export PMIX_MCA_pcompress_base_silence_warning=1 PMIX_MCA_mca_base_component_show_load_errors=0
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp
fi
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export EPL_STDLIB=$root/stdlib
