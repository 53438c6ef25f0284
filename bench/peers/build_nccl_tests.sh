#!/usr/bin/env bash
# Build NVIDIA's nccl-tests (the collective benchmark's `nccl_tests` peer) against the NCCL that torch
# uses: the nvidia-nccl-cu13 wheel's include/ and lib/ are NCCL_HOME. No MPI: one process drives
# every GPU of the node (-g N), as sweepbench runs it. Needs no network: bring the source along.
#
#   bash bench/peers/build_nccl_tests.sh SRC_DIR [BUILD_DIR]      # BUILD_DIR defaults to SRC_DIR/build
#   then: python -m sweepbench -m benchmark=collective benchmark.impl=torch,nccl_tests benchmark.nccl_tests_dir=BUILD_DIR ...
#
# Environment: PYTHON (the interpreter whose torch runs the ranks; default python), CUDA_HOME
# (default /usr/local/cuda), NVCC_GENCODE (default: the first visible GPU's architecture only, which
# builds in a fraction of the time of nccl-tests' list of every architecture), JOBS (make -j).
set -euo pipefail

die() { echo "build_nccl_tests.sh: $*" >&2; exit 2; }

[ $# -ge 1 ] || die "usage: build_nccl_tests.sh SRC_DIR [BUILD_DIR] (SRC_DIR: a checkout of github.com/NVIDIA/nccl-tests)"
src=$(cd "$1" 2>/dev/null && pwd) || die "$1 is not a directory; expected a checkout of github.com/NVIDIA/nccl-tests"
[ -f "$src/src/common.cu" ] && [ -f "$src/Makefile" ] || die "$src is not an nccl-tests source directory (no src/common.cu, Makefile)"
build=$(mkdir -p "${2:-$src/build}" && cd "${2:-$src/build}" && pwd)
python=${PYTHON:-python}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
[ -x "$CUDA_HOME/bin/nvcc" ] || die "no nvcc at $CUDA_HOME/bin/nvcc; set CUDA_HOME to the CUDA toolkit"

# The NCCL wheel torch loads (nvidia.nccl is a namespace package: its __path__, not __file__)
wheel=$("$python" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null) \
  || die "$python cannot import nvidia.nccl; install the NCCL wheel torch uses: pip install nvidia-nccl-cu13"
[ -f "$wheel/include/nccl.h" ] || die "$wheel/include/nccl.h is missing; expected the nvidia-nccl wheel's headers"
ls "$wheel"/lib/libnccl.so* >/dev/null 2>&1 || die "no libnccl.so* under $wheel/lib"

# NCCL_HOME: links to the wheel's include/ and lib/, plus the unversioned libnccl.so the makefile's
# -lnccl looks for (the wheel ships only libnccl.so.2). Nothing is written into site-packages.
home="$build/nccl_home"
mkdir -p "$home/lib"
ln -sfn "$wheel/include" "$home/include"
for lib in "$wheel"/lib/libnccl.so*; do ln -sfn "$lib" "$home/lib/$(basename "$lib")"; done
[ -e "$home/lib/libnccl.so" ] || ln -sfn "$wheel/lib/libnccl.so.2" "$home/lib/libnccl.so"

if [ -z "${NVCC_GENCODE:-}" ] && command -v nvidia-smi >/dev/null; then
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [ -n "$cc" ] && export NVCC_GENCODE="-gencode=arch=compute_$cc,code=sm_$cc"
fi
echo "nccl-tests: $src -> $build (NCCL_HOME=$home -> $wheel, CUDA_HOME=$CUDA_HOME, NVCC_GENCODE=${NVCC_GENCODE:-makefile default})"
make -C "$src" -j"${JOBS:-$(nproc)}" MPI=0 CUDA_HOME="$CUDA_HOME" NCCL_HOME="$home" BUILDDIR="$build"

# The binaries find libnccl.so.2 the way sweepbench runs them: LD_LIBRARY_PATH=<wheel>/lib:<cuda>/lib64
export LD_LIBRARY_PATH="$wheel/lib:$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for bin in all_reduce all_gather reduce_scatter broadcast alltoall sendrecv; do
  [ -x "$build/${bin}_perf" ] || die "make finished but $build/${bin}_perf is missing"
  if ldd "$build/${bin}_perf" | grep -q "not found"; then die "$build/${bin}_perf: $(ldd "$build/${bin}_perf" | grep 'not found' | head -1)"; fi
done
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then  # a one-GPU smoke run, checked
  "$build/all_reduce_perf" -g 1 -b 1M -e 1M -w 1 -n 1 -c 1 | grep -E "^# nccl-tests version|^ +1048576 "
fi
echo "built; use: benchmark.nccl_tests_dir=$build"
