#!/usr/bin/env bash
# Packs a build of EPL for a GPU machine that has CUDA but not EPL's Debian libraries
# (fmt, ANTLR, oneDNN, OpenBLAS, Open MPI): a portable build (no -march=native) of `epl`,
# the kernel probe, the communicators' test and the unit tests, the shared libraries they load apart from the C/C++ runtime and
# CUDA's (as ldd lists them, so oneDNN's OpenMP runtime too), Debian's Open MPI (mpirun,
# its components and PMIx, under .gpu/mpi with the paths it was built for, relocated by
# OPAL_PREFIX in tools/gpu_env.sh: the runs of several ranks), and the text and images the
# GPU tests train on, into .gpu/ and .gpu.tar.xz (ignored by git). tools/gpu_check.sh runs the GPU tests from it, on
# that machine, from a copy of this repository.
# Usage: tools/gpu_bundle.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEPL_NATIVE=OFF >/dev/null
cmake --build "$build" --target epl epl_kernel_probe epl_gpu_comm_test epl_unit_tests

rm -rf .gpu
mkdir -p .gpu/bin .gpu/lib .gpu/data
for exe in "$build/epl" "$build/tests/oracle/epl_kernel_probe" \
           "$build/tests/gpu/epl_gpu_comm_test" "$build/tests/epl_unit_tests"; do
  strip -o ".gpu/bin/$(basename "$exe")" "$exe"
done
# Open MPI as Debian installs it, under a prefix of its own (OPAL_PREFIX moves it there).
multiarch=/usr/lib/x86_64-linux-gnu
mkdir -p .gpu/mpi/usr/bin ".gpu/mpi$multiarch" .gpu/mpi/usr/share
cp -L "$(readlink -f /usr/bin/mpirun)" .gpu/mpi/usr/bin/mpirun
cp -a "$multiarch/openmpi" "$multiarch/pmix2" ".gpu/mpi$multiarch/"
rm -rf ".gpu/mpi$multiarch/openmpi/include" ".gpu/mpi$multiarch/pmix2/include"
cp -a /usr/share/openmpi .gpu/mpi/usr/share/
# What the GPU machine has already: the C and C++ runtime, and CUDA's own libraries.
keep_out='^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux.*|linux-vdso|libcuda|libcublas.*|libcudart|libcudnn.*|libnccl)\.so'
for exe in .gpu/bin/* .gpu/mpi/usr/bin/mpirun ".gpu/mpi$multiarch"/pmix2/lib/libpmix.so.2; do
  ldd "$exe" | awk '/=> \//{print $1, $3}'
done | sort -u | while read -r name path; do
  if ! [[ $name =~ $keep_out ]]; then cp -L "$path" ".gpu/lib/$name"; fi
done
cp /usr/share/games/fortunes/cookie .gpu/data/
# The CNN scripts' images: the first 10,000 of each file (the GPU and CPU runs of a check
# read the same ones), 9 MB where the whole set is 30 MB of the 64 MB a call may carry.
mkdir -p .gpu/data/fashion-mnist
python3 - /usr/share/datasets/fashion-mnist .gpu/data/fashion-mnist <<'PY'
import gzip, os, struct, sys
src, dst = sys.argv[1:]
for name in sorted(os.listdir(src)):
    data = gzip.open(os.path.join(src, name)).read()
    dims = data[3]  # idx: two zero bytes, the type, the number of dims, then each dim
    shape = list(struct.unpack(">%dI" % dims, data[4:4 + 4 * dims]))
    item = len(data[4 + 4 * dims:]) // shape[0]
    kept = min(shape[0], 10000)
    head = data[:4] + struct.pack(">%dI" % dims, kept, *shape[1:])
    body = data[4 + 4 * dims:4 + 4 * dims + kept * item]
    with gzip.open(os.path.join(dst, name), "wb") as f:
        f.write(head + body)
PY
# One compressed file to carry (the libraries alone are about 80 MB, over what a copy of the
# repository may carry to a GPU machine); tools/gpu_check.sh unpacks it there.
tar cJf .gpu.tar.xz .gpu
du -sh .gpu .gpu.tar.xz
