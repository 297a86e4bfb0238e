#!/usr/bin/env bash
# Issue 14, item 9: the BLEU reproduction on one CUDA GPU (`make reproduce-gpu`). Prepared, NOT run in
# this project so far (no GPU was lent to the task that wrote it); CI never runs it.
#
#   1. Table 3's base model (N = 6, d_model 512, 65M parameters) trained on the EN->DE Bible corpus for a
#      fixed budget of MINUTES (preset gpu-base: 25000-token batches as §5.1, warmup 800), checkpoints
#      averaged, decoded with beam 4 (§6.1), scored with sacreBLEU, the paper-style BLEU and chrF, the
#      repetition and the beam-search diagnosis -> $OUT/bleu-training.{md,json}; its tokens/s are the
#      results' target tokens over training seconds.
#   2. Table 3's own rows (base, A1, C1, C4, E at the paper's size) with 5 paired seeds each on a fixed
#      budget of TOKENS target tokens per run (-> $OUT/bleu-ablation.{md,json}, paired t-tests against
#      base and a verdict per row against the paper's direction).
#
# Every number is written with the GPU's name, the TF32 switches (torch-sdpa's version string) and the
# code hash in the reports' signatures. Budget: sized for about 15 minutes of one H100/H200-class GPU
# (an estimate from the CPU runs' operation counts, not a measurement): MINUTES=6 of training plus 25
# ablation runs of TOKENS=1,000,000. Change them with the environment: MINUTES=30 TOKENS=5000000 ...
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
AIAYN=${AIAYN:-.venv/bin/aiayn}
OUT=${OUT:-reports/gpu}
WORK=${WORK:-runs/gpu}
MINUTES=${MINUTES:-6}
TOKENS=${TOKENS:-1000000}
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "reproduce-gpu: torch sees no CUDA device; this script needs one")'
"$PY" -c 'import torch; print("device:", torch.cuda.get_device_name(0), "| torch", torch.__version__, "| TF32 matmul", torch.backends.cuda.matmul.allow_tf32)'
mkdir -p "$OUT"
echo "== 1/2 base model, EN->DE Bible, ${MINUTES} minutes"
"$AIAYN" train --preset gpu-base --device cuda --minutes "$MINUTES" --greedy-too --work "$WORK/base" --out "$OUT"
echo "== 2/2 Table 3's rows at the paper's size, 5 paired seeds, ${TOKENS} target tokens each"
"$AIAYN" ablation --scale paper --device cuda --jobs 1 --seeds 1,2,3,4,5 --tokens "$TOKENS" --max-tokens 12500 --warmup 100 \
    --vocab 8000 --work "$WORK/ablation" --out "$OUT"
echo "== done: $OUT/bleu-training.md, $OUT/bleu-ablation.md"
