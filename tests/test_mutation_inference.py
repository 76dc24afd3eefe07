"""Relations that kill mutants of issue 26's inference modules left alive by its first mutation round."""
