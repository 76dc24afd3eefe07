"""``ripplekv report``: run summaries, statistics and plots (no module imports torch; import them by path)."""
