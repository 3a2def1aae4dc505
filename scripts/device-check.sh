#!/usr/bin/env bash
# The CUDA checks, run on a lent GPU machine through the device tool (one NVIDIA GPU, no network).
#
# Here, once (both folders are ignored, and travel only when named in `carry`):
#   echo /.whl/ >> .git/info/exclude; echo /.device/ >> .git/info/exclude
#   ../shared/tools/device-wheels.sh                       # the packages its image lacks, as wheels
#   mkdir -p .device && cp -r ../shared/conformance .device/
# Then, on the device: carry [".whl", ".device"], command `scripts/device-check.sh`, timeout_s 600
# (about 9 minutes on an H200 once the machine is up).
#
# Each check runs under its own time limit and the script goes on after a failure; the whole log is
# $OUT/device-check.log and the stacks' logs $OUT/stack-*.log. The checks, on cuda:0, most telling
# first (a run cut short by its time limit still brings back what it did):
#   1. the bfloat16 forward against the official code's bf16 golden (bench/bench_conformance.py);
#   2. the default stack on `--backend cuda` (the demo model, bfloat16): `dsv4serve check` and the
#      held-out tool-call accuracy (bench/bench_demo_accuracy.py);
#   3. end-to-end decode against the bare forward at batch 8 and 32 (bench/bench_e2e_vs_forward.py),
#      and where a batch-8 decode step's time goes (bench/bench_step_profile.py);
#   4. the float32 forward against the fp32 golden; the bare forward's throughput and memory
#      bandwidth (bench/bench_model.py);
#   5. speculation: the demo stack with its MTP block drafting K = 7, then with its DSpark draft.
# CHECKS="speculation demo" (the names of `main`'s groups) runs only those groups, in that order.
set -u
OUT=${OUT:-/tmp/device-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}   # PYTHON=.venv/bin/python: a rehearsal here, without the wheels
if [ -z "${PYTHON:-}" ] && [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=$PWD:/tmp/site
else
  export PYTHONPATH=$PWD
fi
CONFORMANCE=${CONFORMANCE:-.device/conformance}
DEVICE=${DEVICE:-cuda:0}   # with DEVICE=cpu DTYPE=float32 COUNT=5 too
DTYPE=${DTYPE:-bfloat16}
COUNT=${COUNT:-100}
CHECKS=${CHECKS:-conformance demo e2e float32 model speculation}
PORT=8000
STACK_PID=

check() {  # check NAME LIMIT_S COMMAND...: the command's output, its exit code and its time
  local name=$1 limit=$2
  shift 2
  echo "=== $name ($(date +%T))"
  local start=$SECONDS
  timeout "$limit" "$@" 2>&1
  echo "=== $name: rc=$? in $((SECONDS - start)) s"
}

start_stack() {  # start_stack NAME STACK_ARGS...: the stack on $PORT, ready or not within 300 s
  local name=$1
  shift
  rm -f /tmp/ready.json
  $PY -m services.cli stack --backend "${DEVICE%%:*}" --dtype "$DTYPE" --port "$PORT" --ready-file /tmp/ready.json "$@" \
    >"$OUT/stack-$name.log" 2>&1 &
  STACK_PID=$!
  local start=$SECONDS
  while [ ! -f /tmp/ready.json ] && kill -0 "$STACK_PID" 2>/dev/null && [ $((SECONDS - start)) -lt 300 ]; do
    sleep 1
  done
  if [ -f /tmp/ready.json ]; then
    echo "=== stack $name ready in $((SECONDS - start)) s"
  else
    echo "=== stack $name did not start; its log:"; tail -n 40 "$OUT/stack-$name.log"
  fi
}

stop_stack() {
  [ -n "$STACK_PID" ] && kill -TERM "$STACK_PID" 2>/dev/null && wait "$STACK_PID"
  STACK_PID=
}

conformance() {
  check conformance-$DTYPE 180 $PY -m bench.bench_conformance --conformance "$CONFORMANCE" \
    --device "$DEVICE" --dtype "$DTYPE"
}

demo() {
  start_stack demo
  check dsv4serve-check 120 $PY -m services.cli check --url "http://127.0.0.1:$PORT"
  check demo-accuracy 240 $PY -m bench.bench_demo_accuracy --url "http://127.0.0.1:$PORT" --count "$COUNT"
  stop_stack
}

e2e() {
  for batch in 8 32; do
    check "e2e-vs-forward-batch-$batch" 240 $PY bench/bench_e2e_vs_forward.py --device "$DEVICE" \
      --dtype "$DTYPE" --batch "$batch" --rounds 2 --async-scheduling on
  done
  check step-profile 120 $PY -m bench.bench_step_profile --device "$DEVICE" --dtype "$DTYPE" \
    --batch 8 --steps 8 --top 30
}

float32() {
  check conformance-float32 180 $PY -m bench.bench_conformance --conformance "$CONFORMANCE" \
    --device "$DEVICE" --dtype float32
}

model() {
  check bench-model 180 $PY bench/bench_model.py --presets tiny-a bench-1024 --batches 1 8 32 \
    --device "$DEVICE" --dtype "$DTYPE" --peak-gbs 4800
}

speculation() {  # K = 7 with the MTP block, then with the DSpark draft (the demo's DSpark variant)
  start_stack demo-mtp --speculative-config '{"method":"mtp","num_speculative_tokens":7}'
  check demo-accuracy-mtp 240 $PY -m bench.bench_demo_accuracy --url "http://127.0.0.1:$PORT" --count "$COUNT"
  stop_stack
  local dspark_dir
  dspark_dir=$($PY -c "from services.demo.draft_export import demo_dspark_model_dir; print(demo_dspark_model_dir())")
  start_stack demo-dspark --model "$dspark_dir" \
    --speculative-config '{"method":"dspark","num_speculative_tokens":7}'
  check demo-accuracy-dspark 240 $PY -m bench.bench_demo_accuracy --url "http://127.0.0.1:$PORT" --count "$COUNT"
  stop_stack
}

main() {
  nvidia-smi -L
  $PY -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.is_available())"
  for group in $CHECKS; do
    "$group"
  done
}

main 2>&1 | tee "$OUT/device-check.log"
