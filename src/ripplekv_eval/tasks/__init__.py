"""The benchmarks' own protocols: LongBench's data, prompts and metrics, the RULER-style generators, JSON lines."""
