"""The shared-prefill fast path: one prefill per prompt recorded, every configuration's cache derived from it."""
