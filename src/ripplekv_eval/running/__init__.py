"""Running an evaluation: its options, the rows of one sample, the run loop, the resumable results log, Ray."""
