#!/usr/bin/env bash
# The scale benchmark on a GPU, as one prepared run: GPT-2-small shape and a ~1B Llama shape
# (benchmarks/scale.py's llama-1b), bfloat16, every row; JSON lines under ${OUT:-gpu-results}/.
# Not yet run: no GPU has been lent to these tasks.
#     bash benchmarks/gpu.sh            # then: python benchmarks/scale.py --table gpu-results/*.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-results}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
for shape in gpt2-small llama-1b; do
    python benchmarks/scale.py --shape "$shape" --device cuda --dtype bfloat16 --repeats 3 --threads 8 \
        --out "$out/scale_${shape}_cuda_bf16.jsonl" | tee "$out/scale_${shape}_cuda_bf16.txt"
done
