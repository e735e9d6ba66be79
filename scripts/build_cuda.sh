#!/usr/bin/env bash
# Build voxcache with `--features cuda` on a machine with no GPU and no system CUDA.
#
#   bash scripts/build_cuda.sh            # binaries + GPU op tests -> target/cuda-dist/
#   bash scripts/build_cuda.sh clippy     # lint the cuda build instead (same toolchain setup)
#
# The CUDA 13.0 compiler, headers and the libraries we link against come from PyPI wheels
# (NVIDIA publishes nvcc, the runtime, cuBLAS, cuRAND, NVRTC and cuDNN there); nothing needs root.
# The one library no wheel ships is the driver's libcuda.so: we link against a stub that only
# names its functions (as the toolkit's own lib/stubs/libcuda.so does), and the real driver
# provides them where the binary runs. Pinned to 13.0 because PTX from a newer nvcc does not load
# on a 13.0 driver (580); override with CUDA_RELEASE / CUDA_COMPUTE_CAP for other machines.
#
# Output, self-contained apart from the libraries (scripts/gpu_check.sh finds them where the
# GPU is): target/cuda-dist/{prep,train,predict,evaluate,gpu_ops,bench_train_step}, and the
# same packed as target/gpu-carry/cuda-dist.tar.xz (about 50 MB: each binary embeds candle's
# GPU code) to carry to a GPU machine.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
toolkit=${VOXCACHE_CUDA_TOOLKIT:-$root/target/cuda-toolkit}
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
python=${PYTHON:-python3}

# Versions that belong together (one CUDA release); the libraries only need the same major
# version (their sonames) as the ones present where the binary runs.
nvcc_v=13.0.88
wheels=(
  "nvidia-cuda-nvcc==$nvcc_v" "nvidia-cuda-crt==$nvcc_v" "nvidia-nvvm==$nvcc_v"
  "nvidia-cuda-nvrtc==$nvcc_v" "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-cccl==13.0.85"
  "nvidia-curand==10.4.0.35" "nvidia-cublas==13.0.2.14" "nvidia-cudnn-cu13==9.13.0.50"
)

stamp="$toolkit/.installed"
if [[ ! -f $stamp || $(cat "$stamp") != "${wheels[*]}" ]]; then
  echo "== installing the CUDA toolkit wheels into $toolkit"
  rm -rf "$toolkit"
  mkdir -p "$toolkit"
  "$python" -m pip install --quiet --no-deps --target "$toolkit/site" "${wheels[@]}"
  echo "${wheels[*]}" >"$stamp"
fi

cuda_home="$toolkit/site/nvidia/cu13"
[[ -x $cuda_home/bin/nvcc ]] || { echo "no nvcc under $cuda_home" >&2; exit 1; }

# One folder with the unversioned names the linker looks for (-lcublas finds libcublas.so).
links="$toolkit/link"
rm -rf "$links"
mkdir -p "$links"
for lib in "$toolkit"/site/nvidia/*/lib/lib*.so.* "$toolkit"/site/nvidia/cu13/lib/lib*.so.*; do
  [[ -e $lib ]] || continue
  base=$(basename "$lib")
  stem=${base%%.so.*}
  [[ -e $links/$stem.so ]] || ln -s "$lib" "$links/$stem.so"
done

# The driver stub: every function cudarc's driver bindings name, with libcuda.so.1 as soname
# so that the binary asks for the real driver at run time.
cudarc_v=$(grep -A1 '^name = "cudarc"$' Cargo.lock | sed -n 's/^version = "\(.*\)"$/\1/p')
cudarc_src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"cudarc-$cudarc_v" 2>/dev/null | head -1 || true)
if [[ -z $cudarc_src ]]; then
  cargo fetch --quiet
  crate=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"cudarc-$cudarc_v.crate" | head -1)
  mkdir -p "$toolkit/src"
  tar xzf "$crate" -C "$toolkit/src"
  cudarc_src="$toolkit/src/cudarc-$cudarc_v"
fi
grep -oP '^\s+fn \Kcu[A-Za-z0-9_]+(?=\()' "$cudarc_src/src/driver/sys/mod.rs" | sort -u |
  sed 's/.*/int &(void) { return 999; }/' >"$toolkit/cuda_stub.c"
cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$links/libcuda.so" "$toolkit/cuda_stub.c"
echo "== driver stub: $(wc -l <"$toolkit/cuda_stub.c") functions"

export CUDA_HOME="$cuda_home" CUDA_PATH="$cuda_home" CUDA_ROOT="$cuda_home"
export PATH="$cuda_home/bin:$PATH"
export CUDARC_CUDA_VERSION=13000
export LIBRARY_PATH="$links${LIBRARY_PATH:+:$LIBRARY_PATH}"
export RUSTFLAGS="${RUSTFLAGS:-} -L native=$links"
# The CPU build keeps target/release; this one lives beside it.
target_dir="$root/target/cuda"

if [[ ${1:-} == clippy ]]; then
  exec cargo clippy --release --features cuda --target-dir "$target_dir" --all-targets -- -D warnings
fi

echo "== cargo build --release --features cuda (CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP)"
cargo build --release --features cuda --target-dir "$target_dir" --bins --example bench_train_step
tests_json=$(cargo test --release --features cuda --target-dir "$target_dir" --test gpu_ops \
  --no-run --message-format=json 2>/dev/null)

dist="$root/target/cuda-dist"
rm -rf "$dist"
mkdir -p "$dist"
for b in prep train predict evaluate; do cp "$target_dir/release/$b" "$dist/"; done
test_bin=$(echo "$tests_json" | grep -oP '"executable":"\K[^"]+gpu_ops-[0-9a-f]+' | tail -1)
cp "$test_bin" "$dist/gpu_ops"
cp "$target_dir/release/examples/bench_train_step" "$dist/"
strip "$dist"/*
mkdir -p "$root/target/gpu-carry"
tar -C "$root/target" -cJf "$root/target/gpu-carry/cuda-dist.tar.xz" cuda-dist
echo "== built; carry target/gpu-carry to the GPU machine, where scripts/gpu_check.sh runs them:"
ls -la "$dist" "$root/target/gpu-carry"
echo "== libraries the binaries ask for:"
readelf -d "$dist/train" | grep NEEDED
