#!/usr/bin/env bash
# The GPU test files, each in a process of its own (a device-side assert fails every later CUDA call of its
# process), each under its own time limit sent as SIGINT: pytest then stops and still prints its summary and
# the failures so far (a SIGTERM cut both, 2026-12-04). Run from the repository root on the GPU machine:
#   bash bench/gpu_tests.sh [FILE ...]            # default: every tests/**/test_gpu_*.py
#   PER_FILE=150 PYTEST_ARGS='-k "not projection_timing"' bash bench/gpu_tests.sh tests/trainer/target/test_gpu_fp8.py
# Prints one "== FILE: rc=N, S s" line per file after its output; exits non-zero if any file failed.
set -u
per_file=${PER_FILE:-150}
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
    mapfile -t files < <(find tests -name 'test_gpu_*.py' | sort)
fi
status=0
for f in "${files[@]}"; do
    start=$(date +%s)
    eval timeout -s INT -k 20 "$per_file" python3 -m pytest -x -q --tb=short -rfE -p no:cacheprovider \
        "${PYTEST_ARGS:-}" "$f"
    rc=$?
    echo "== $f: rc=$rc, $(( $(date +%s) - start )) s"
    [ $rc -eq 0 ] || [ $rc -eq 5 ] || status=1  # 5: nothing collected (all deselected)
done
exit $status
