# Sourced on the GPU machine: library path for the binaries that
# tools/device/pack_cuda.sh carried (CUDA runtime, cuBLAS and NCCL from the
# machine's toolkit, else from PyTorch's nvidia-* wheels).
if [ -f .devcarry/pack.tgz ] && [ ! -d .devcarry/bin ]; then
  tar -C .devcarry -xzf .devcarry/pack.tgz
fi
_dirs="$PWD/.devcarry/lib"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libcublasLt.so.13" ] && _dirs="$_dirs:$d"
done
_py=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null || true)
if [ -n "$_py" ]; then
  for d in "$_py"/nvidia/cu13/lib "$_py"/nvidia/cublas/lib "$_py"/nvidia/cuda_runtime/lib \
           "$_py"/nvidia/nccl/lib; do
    [ -d "$d" ] && _dirs="$_dirs:$d"
  done
fi
export LD_LIBRARY_PATH="$_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PWD/.devcarry/bin:/usr/local/cuda/bin:$PATH"
unset _dirs _py d
