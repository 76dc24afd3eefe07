"""Relations that kill the mutants of issue 26's inference modules the first mutation round left alive (benchmarks/mutation.py)."""
