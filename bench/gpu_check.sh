#!/usr/bin/env bash
# GPU smoke check. Part 1 (any machine): HAPPO update time on CPU next to CUDA ("no GPU" without one).
# Part 2 (a CUDA machine with vllm, `pip install -e .[gpu]`): a 5-question GSM8K MAD debate through vLLM
# in-process with its decode throughput, then the raw backend batch throughput for comparison.
#
#   bash bench/gpu_check.sh                          # Qwen/Qwen2.5-1.5B-Instruct
#   MODEL=Qwen/Qwen2.5-7B-Instruct bash bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL="${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}"
N="${N:-5}"
PYTHON="${PYTHON:-python}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's code, not another installed copy

echo "== HAPPO learner update (run.device): CPU vs GPU =="
"$PYTHON" bench/bench_happo.py --update-devices

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no GPU (nvidia-smi missing or failing); the vLLM part needs a CUDA machine. Done."
  exit 0
fi
if ! "$PYTHON" -c "import vllm" >/dev/null 2>&1; then
  echo "gpu_check: vllm is not importable; install the gpu extra: pip install -e .[gpu]" >&2
  exit 2
fi
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: torch.cuda.is_available() is False (CPU-only torch build or driver problem)." >&2
  exit 2
fi

nvidia-smi -L
echo "== ${N}-question GSM8K MAD debate, llm=vllm:${MODEL} (no response cache) =="
log="$(mktemp)"
start=$(date +%s.%N)
"$PYTHON" -m dear.debate --task gsm8k --n "$N" --protocol mad --llm "vllm:${MODEL}" --no-cache | tee "$log"
end=$(date +%s.%N)

# The debate CLI's summary reports "tokens/question N (prompt P, completion C)" and "... X decoded tok/s".
completion=$(sed -n 's/.*tokens\/question.*completion \([0-9]*\)).*/\1/p' "$log" | tail -1)
decoded=$(sed -n 's/.* \([0-9.]*\) decoded tok\/s.*/\1/p' "$log" | tail -1)
elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
echo "== result =="
echo "wall time (incl. model load): ${elapsed}s"
if [[ -n "$completion" ]]; then
  awk -v c="$completion" -v t="$elapsed" 'BEGIN { printf "completion tokens: %d -> %.1f tok/s over the whole run\n", c, c / t }'
fi
if [[ -n "$decoded" ]]; then
  echo "decode throughput inside the engine: ${decoded} tok/s"
fi
rm -f "$log"

echo "== raw vLLM batch throughput (15 requests = 5 debates x 3 agents) =="
"$PYTHON" bench/bench_backend.py --llm "vllm:${MODEL}" --batch 15 --max-tokens 256 --skip-single
