"""The harness's commands (``ripplekv eval``, ``report``, ``analyze``, ``tune``), entry points of ``ripplekv``."""
