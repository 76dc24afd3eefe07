"""Relations that kill mutants of issue 26's presses modules left alive by its first mutation round."""
