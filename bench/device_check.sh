#!/usr/bin/env bash
# The course on a GPU, in one prepared run: what has to hold on CUDA, then
# the benchmarks, summed up in one table.
#
# Run from anywhere: bash bench/device_check.sh
# It takes at most about 8 minutes (each step has a time limit), needs the
# project installed with its dev extras (pip install -e ".[dev]") and a torch
# built with CUDA, and writes each step's whole output under $OUT/device_check
# (or a fresh temporary folder), which it names at the end. Without CUDA it
# says so in one line and exits 0: there is nothing for it to prove.
#
# The steps:
#   grade      mha-course grade --solutions --device cuda: full marks
#   corpus     tests/test_correct_styles.py with the grades on CUDA
#   attacks    tests/test_attacks.py with the grades on CUDA
#   verify     mha-course verify --device cuda: reference passes, stub fails, every known bug caught
#   bench      grade_course.py (CPU, then CUDA), flash_attention.py and flash_backward.py on CUDA,
#              batch_throughput.py with 2 jobs and with one a core
# The exit status is 1 when a step that must hold did not (a benchmark's
# figures are only reported).
set -uo pipefail
cd "$(dirname "$0")/.."

# One import of torch says both: the device's name ("" without CUDA) and torch's version.
if ! found=$(python -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "", torch.__version__, sep="|")' 2>/dev/null); then
  echo "device_check: torch does not import here; install the course first (pip install -e \".[dev]\")"
  exit 0
fi
cuda=${found%|*} torch_version=${found##*|}
if [ -z "$cuda" ]; then
  echo "device_check: no CUDA device here (torch $torch_version), nothing to check"
  exit 0
fi

logs=${OUT:-$(mktemp -d)}/device_check
mkdir -p "$logs"
cores=$(python -c 'import os; print(len(os.sched_getaffinity(0)))')
processes=$(( cores > 8 ? 8 : cores ))
export MHA_COURSE_TEST_DEVICE=cuda  # the tests' grades run their checks on CUDA (tests/conftest.py)
rows=()
failed=0

# step NAME LIMIT_SECONDS COMMAND...: run it, keep its output, add a row
# whose last column is the output's last line (pytest's summary, a score).
step() {
  local name=$1 limit=$2
  shift 2
  local started=$SECONDS status verdict
  timeout --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
  status=$?
  case $status in
    0) verdict=passed ;;
    124|137) verdict="timed out (${limit} s)"; failed=1 ;;
    *) verdict="FAILED ($status)"; failed=1 ;;
  esac
  local last
  last=$(grep -v '^\s*$' "$logs/$name.log" | tail -n 1 | cut -c1-90)
  rows+=("$(printf '%-8s %-20s %5d s  %s' "$name" "$verdict" $((SECONDS - started)) "$last")")
}

step grade 120 python -m grader grade --solutions --device cuda --seed 0
step corpus 150 python -m pytest -q -p no:randomly -n "$processes" tests/test_correct_styles.py
step attacks 120 python -m pytest -q -p no:randomly -n "$processes" tests/test_attacks.py
step verify 150 python -m grader verify --device cuda --seed 0 --jobs "$processes"

# The benchmarks: figures for the note, not verdicts.
bench_started=$SECONDS
timeout 150 python bench/grade_course.py --runs 3 --chapters >"$logs/bench_grade_cpu.log" 2>&1
timeout 90 python bench/grade_course.py --runs 3 --device cuda >"$logs/bench_grade_cuda.log" 2>&1
timeout 60 python bench/flash_attention.py --device cuda >"$logs/bench_flash.log" 2>&1
timeout 60 python bench/flash_backward.py --device cuda --length 4096 >"$logs/bench_flash_backward.log" 2>&1
timeout 90 python bench/batch_throughput.py --students 24 --runs 1 --jobs 2 >"$logs/bench_batch_2.log" 2>&1
timeout 60 python bench/batch_throughput.py --students 24 --runs 1 --jobs "$cores" >"$logs/bench_batch_all.log" 2>&1
rows+=("$(printf '%-8s %-20s %5d s  %s' bench "figures below" $((SECONDS - bench_started)) "")")

echo "device_check on $cuda, $cores cores, torch $torch_version"
printf '%s\n' "${rows[@]}"
for log in bench_grade_cpu bench_grade_cuda bench_flash bench_flash_backward bench_batch_2 bench_batch_all; do
  echo "-- $log"
  grep -v '^\s*$' "$logs/$log.log" | tail -n 14
done
echo "each step's output: $logs"
exit $failed
