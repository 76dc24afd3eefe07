"""``ripplekv analyze`` and ``ripplekv tune``: per-layer damage, its rank agreement with a profile, tuning."""
