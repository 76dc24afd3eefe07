"""Relations that kill mutants of issue 26's reports modules left alive by its first mutation round."""
