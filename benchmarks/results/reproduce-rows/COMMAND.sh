#!/usr/bin/env bash
# The smoke check committed with benchmarks/reproduce_rows.py: the first 2 rows of each run's seeded draw of 20
# (draw.json), recomputed with the current code (rows.jsonl; the printed table in output.txt). Without --rows, the
# full check (20 rows per run) resumes from these. --data-dir: LongBench's folder where ../shared is not beside the
# repository (a worktree).
cd "$(dirname "$0")/../../.."
python benchmarks/reproduce_rows.py --rows 2 --threads 2 "$@"
