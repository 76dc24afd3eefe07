"""Running an evaluation: its options, the rows of one sample, the run loop, the resumable results log, Ray.

Nothing is imported here: import the modules by path (:mod:`~ripplekv_eval.running.results` imports no
torch, and the report reads it).
"""
