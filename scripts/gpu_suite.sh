#!/usr/bin/env bash
# Builds deft for Hopper, runs the whole test suite (cuda tests included) and the main example on the default
# device, and prints the GPU it ran on; then compute-sanitizer over the cuda tests and examples
# (scripts/check_gpu_sanitizers.sh; SANITIZERS=0 leaves it out). Usage: scripts/gpu_suite.sh [log-dir]
set -uo pipefail
log=${1:-gpu-logs}
mkdir -p "$log"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$log/gpu.txt"
cmake -S . -B build-gpu -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release > "$log/configure.txt" 2>&1 \
  || { tail -30 "$log/configure.txt"; exit 1; }
cmake --build build-gpu -j 16 > "$log/build.txt" 2>&1 || { grep -E "error|FAILED" -A5 "$log/build.txt" | head -60; exit 1; }
echo "built"
(cd build-gpu && ctest --output-on-failure -j 4 --timeout 600) > "$log/ctest.txt" 2>&1
rc=$?
grep -E "Test +#|tests passed|FAILED|CHECK failed" "$log/ctest.txt" | head -80
(cd build-gpu && ./hello_deft) 2>&1 | tee "$log/hello.txt" | head -40
if [ "${SANITIZERS:-1}" = 1 ]; then
  scripts/check_gpu_sanitizers.sh build-gpu "$log/sanitizers" > "$log/sanitizers.txt" 2>&1 || rc=1
  grep -vE ": clean$" "$log/sanitizers.txt" | head -60
fi
exit $rc
