#!/usr/bin/env bash
# The wheels nnU-Net v2 needs on the GPU machine beyond what its image holds (PyTorch, numpy,
# scipy, scikit-image, scikit-learn, pandas, matplotlib, seaborn, tifffile, requests, einops,
# timm, httpx, rich, msgpack, threadpoolctl are there; the machine has no network), for
# scripts/gpu_loop_match.py's nnU-Net side. Run here, where pip reaches PyPI:
#
#   bash scripts/gpu_nnunet_wheels.sh        # -> .whl/ (about 20 MB; git ignores it)
#
# then, in the device call that runs nnU-Net, carry `.whl` and begin the command with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
# SimpleITK (53 MB) is left out: gpu_loop_match.py sets NibabelIO in dataset.json and puts an
# empty stand-in SimpleITK package on the path, so nnU-Net never calls it.
# Versions: those the project's nnU-Net comparisons ran with (nnunetv2 2.8.1).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/.whl"
python=${PYTHON:-python3}
pins=(
  nnunetv2==2.8.1 batchgenerators==0.25.5 batchgeneratorsv2==0.3.6 blosc2==4.14.1
  ndindex==1.10.1 numexpr==2.14.2 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
  typing-inspection==0.4.5 h2==4.4.1 hpack==4.2.0 hyperframe==6.1.0
  dynamic-network-architectures==0.4.4 nibabel==5.4.2 graphviz==0.21 yacs==0.1.8
  connected-components-3d==4.1.1 future==1.0.0 unittest2==1.1.0 linecache2==1.0.0
  traceback2==1.4.0
)
rm -rf "$out"
mkdir -p "$out"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
# Built for the machine's Python 3.12 whatever the Python here.
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d "$out" "${pins[@]}"
# acvl-utils publishes only a source archive: build its (pure Python) wheel here.
"$python" -m pip wheel -q --no-deps -w "$out" acvl-utils==0.2.6
echo "$(ls "$out" | wc -l) wheels, $(du -sh "$out" | cut -f1) in $out"
