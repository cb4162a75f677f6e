#!/usr/bin/env bash
# Compare the torch engine with fisher_ref on a CUDA machine, and time it.
#
# Run from the repository root of a copy of the working tree:
#     OUT=/some/dir bash benchmarks/gpu/gpu_compare.sh
# For every shipped config it runs
#     python -m fisher_ref compare --config NAME --device cuda --dtype float64,float32,bfloat16
# and writes NAME.txt (the table) and NAME.json (the rows) to $OUT. The GPT-2 configs
# need transformers; where it cannot be imported they are listed as skipped (not failed).
# Then: the benchmark of the default config and of the V=16 scale config
# (bench_default.txt/json, bench_v16.txt/json; one process per side, one thread each on
# the CPU), the torch shards merged against one run on CUDA (benchmarks/gpu/torch_shards_check.py:
# shards_cuda.txt/json), the large task of benchmarks/memory/torch_big_task.py run on CUDA
# (big_task_cuda.json), the scale config gpt2_p100k (P=101,696) run on CUDA with its arrays
# saved (gpt2_p100k_cuda.json, gpt2_p100k_arrays.npz, for benchmarks/gpu/cross_device.py to hold
# against the numpy engine), the GPU name, and the seconds each stage took (stages.txt).
# DEVICE (default cuda) names another device, to try the script where there is no GPU;
# STAGE_LIMIT (seconds, default 300) bounds each of the two large runs (timeout(1)). On a
# CPU the V=16, T=5 task takes about 560 s on one thread, past the default limit: a CPU
# trial then exits 1 for that stage unless STAGE_LIMIT is raised.
# Installs nothing that is already there: torch must be importable with CUDA;
# fisher_ref's own dependencies (numpy, scipy, autograd) are looked for first on
# PYTHONPATH and in ./.gpu_site (a folder of copied packages, for a machine without
# network: e.g.
#     mkdir -p .gpu_site && cp -r $(python -c 'import autograd,os;print(os.path.dirname(autograd.__file__))') .gpu_site/
# ), and installed from PyPI with pip only when still missing (that step needs
# network access to PyPI).
# Exit status: 1 if any compare row failed, 0 otherwise.
set -u
OUT="${OUT:-./gpu_compare_out}"
PY="${PYTHON:-python3}"
DEV="${DEVICE:-cuda}"
LIMIT="${STAGE_LIMIT:-300}"
mkdir -p "$OUT"
if [ "$DEV" = cuda ]; then
nvidia-smi --query-gpu=name --format=csv
"$PY" - <<'PYEOF' || exit 3
import torch, sys
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
sys.exit(0 if torch.cuda.is_available() else 1)
PYEOF
fi
T0=$SECONDS
stage() { echo "$1 $((SECONDS - T0)) s" | tee -a "$OUT/stages.txt"; T0=$SECONDS; }
[ -d .gpu_site ] && export PYTHONPATH="$PWD/.gpu_site${PYTHONPATH:+:$PYTHONPATH}"
for mod in numpy scipy autograd; do
  "$PY" -c "import $mod" 2>/dev/null || "$PY" -m pip install --quiet "$mod" || exit 3
done
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
HAVE_HF=0
"$PY" -c "import transformers" 2>/dev/null && HAVE_HF=1
status=0
for cfg in $("$PY" -c "from fisher_ref import list_configs; print(' '.join(list_configs()))"); do
  if [ "$HAVE_HF" -eq 0 ] && [ "${cfg#gpt2}" != "$cfg" ]; then
    echo "=== $cfg: skipped (transformers cannot be imported here)" | tee "$OUT/$cfg.skipped"
    continue
  fi
  echo "=== $cfg"
  "$PY" -m fisher_ref compare --config "$cfg" --device "$DEV" --dtype float64,float32,bfloat16 \
      --json "$OUT/$cfg.json" > "$OUT/$cfg.txt" 2>&1
  rc=$?
  tail -n 1 "$OUT/$cfg.txt"
  [ "$rc" -eq 0 ] || { status=1; grep -E "FAIL|error" "$OUT/$cfg.txt"; }
  stage "compare $cfg"
done
"$PY" -m fisher_ref bench --config default --device "$DEV" --repeats 5 \
    --json "$OUT/bench_default.json" > "$OUT/bench_default.txt" 2>&1
cat "$OUT/bench_default.txt"
stage "bench default"
"$PY" -m fisher_ref bench --task fisher_ref/configs/scale/v16.json --device "$DEV" --repeats 3 \
    --json "$OUT/bench_v16.json" > "$OUT/bench_v16.txt" 2>&1
cat "$OUT/bench_v16.txt"
stage "bench v16"
"$PY" benchmarks/gpu/torch_shards_check.py --device "$DEV" --out "$OUT/shards_$DEV.json" \
    > "$OUT/shards_$DEV.txt" 2>&1 || status=1
cat "$OUT/shards_$DEV.txt"
stage "shards"
timeout "$LIMIT" "$PY" benchmarks/memory/torch_big_task.py --config gpt2_p100k --device "$DEV" \
    --out "$OUT/gpt2_p100k_$DEV.json" --arrays "$OUT/gpt2_p100k_arrays.npz" \
    > "$OUT/gpt2_p100k_$DEV.txt" 2>&1 || status=1
tail -n 16 "$OUT/gpt2_p100k_$DEV.txt"
stage "gpt2_p100k"
timeout "$LIMIT" "$PY" benchmarks/memory/torch_big_task.py --device "$DEV" --out "$OUT/big_task_$DEV.json" \
    > "$OUT/big_task_$DEV.txt" 2>&1 || status=1
tail -n 14 "$OUT/big_task_$DEV.txt"
stage "big task"
[ "$DEV" = cuda ] && nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu_name.txt"
exit "$status"
