#!/usr/bin/env bash
# Build the vllm 0.26.0 payload for the offline H200 machine, on a PyPI-connected x86-64 box (no device time,
# about 12 minutes on 2 cores).
# usage: tests/tools/device_vllm/build_chunks.sh DEST [WORKDIR]
#   DEST gets chunk folders of at most PART_MB MiB each (default 17), named by what they hold:
#     DEST/c01 .. c0N   the dense payload (vLLM's _C and FA3 kernels, the Python tree, the 81 wheels the
#                       device image lacks), one stream cut into pieces: every dense model needs all of them
#     DEST/m01 .. m0K   the fused-MoE kernels (vllm/_moe_C_stable_libtorch.abi3.so): DeepSeek-V2/V3-class
#                       models only; a dense model's calls need not carry them
#     DEST/SHA256SUMS   the sums of the pieces and of the two whole streams (install.py checks them; a copy in
#                       every chunk folder, so any carried chunk brings them)
#   A device call carries at most 64 MiB (tracked files of the checkout, about 8 MB, + the carried paths):
#   with PART_MB=17 three chunks travel in a call without the project tree, two with it.
set -euo pipefail
DEST=${1:?destination folder, e.g. /work/main/.vllmchunks}; W=${2:-${TMPDIR:-/tmp}/device-vllm-build}
PART_MB=${PART_MB:-17}; HERE=$(cd "$(dirname "$0")" && pwd)
# a Python 3.12 to resolve and pre-install cp312 wheels (the device's Python is 3.12). A `python3.12` on PATH
# can be a pyenv shim that exits "command not found" when 3.12 is not the selected version: try pyenv's real
# interpreters first, and take the first candidate that really runs 3.12 (or set PY312)
if [ -z "${PY312:-}" ]; then
  for c in $(ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.12*/bin/python3.12 2>/dev/null) \
           /usr/bin/python3.12 /usr/local/bin/python3.12 $(command -v python3.12 || true); do
    "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { PY312=$c; break; }
  done
fi
"${PY312:-false}" -c 'import sys; assert sys.version_info[:2] == (3, 12)' || { echo "no Python 3.12 runs here: set PY312" >&2; exit 1; }
echo "PY312=$PY312"
mkdir -p "$W" && cd "$W"
[ -x venv/bin/python ] || { "$PY312" -m venv venv; venv/bin/python -m pip install -q --upgrade pip; }
PLAT="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64"
DL="venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT -d whl"
mkdir -p whl
$DL vllm==0.26.0
# wheels the device image lacks (KINDS.md package list), as resolved with --uploaded-prior-to 2026-07-26 (vllm 0.26.0 came out 2026-07-25)
$DL -r "$HERE/pins-device-missing.txt"
rm -rf overlay
venv/bin/python -m pip install -q --no-deps --no-compile --target overlay whl/*.whl
cd overlay
# slim: FA2 (FA3 serves sm_90), the Rust front end, other-Python deep_gemm builds, JIT headers, xgrammar's static
# lib. The MoE kernels stay (packed on their own below): without them a DeepSeek-V2/V3 model fails at its first
# forward pass ('_moe_C' object has no attribute 'moe_align_block_size')
rm -f vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/vllm-rs vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so xgrammar/lib/libxgrammar.a
rm -rf vllm/third_party/fmha_sm100/cutlass vllm/third_party/deep_gemm/include bin
find . -name __pycache__ -type d -prune -exec rm -rf {} +
cd ..
rm -rf packs && mkdir -p packs/dense
xz -T1 -6 -c overlay/vllm/_C_stable_libtorch.abi3.so > packs/dense/C.so.xz &
xz -T1 -6 -c overlay/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so > packs/dense/fa3.so.xz &
wait
xz -T1 -6 -c overlay/vllm/_moe_C_stable_libtorch.abi3.so > packs/moe.so.xz &
tar cf - -C overlay --exclude=./vllm/_C_stable_libtorch.abi3.so --exclude=./vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so \
  --exclude=./vllm/_moe_C_stable_libtorch.abi3.so . | xz -T1 -6 > packs/dense/rest.tar.xz
wait
tar cf packs/dense.tar -C packs/dense C.so.xz fa3.so.xz rest.tar.xz      # already compressed: one stream to cut
rm -rf "$DEST" && mkdir -p "$DEST"
cut_into() { # $1 = stream, $2 = prefix of the chunk folders
  local tmp; tmp=$(mktemp -d); split -b "${PART_MB}M" -d -a 2 "$1" "$tmp/$2."
  local i=1; for p in "$tmp/$2".*; do d=$(printf '%s/%s%02d' "$DEST" "$2" "$i"); mkdir -p "$d"; mv "$p" "$d/"; i=$((i + 1)); done
  rmdir "$tmp"
}
cut_into packs/dense.tar c
cut_into packs/moe.so.xz m
( cd "$DEST" && sha256sum ./*/* > SHA256SUMS.parts )
{ (cd packs && sha256sum dense.tar moe.so.xz); cat "$DEST/SHA256SUMS.parts"; } > "$DEST/SHA256SUMS"; rm "$DEST/SHA256SUMS.parts"
for d in "$DEST"/[cm][0-9]*; do cp "$DEST/SHA256SUMS" "$d/"; done      # each chunk folder carries the sums
sha256sum overlay/vllm/_C_stable_libtorch.abi3.so overlay/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so overlay/vllm/_moe_C_stable_libtorch.abi3.so
du -sb "$DEST"/* packs/*
