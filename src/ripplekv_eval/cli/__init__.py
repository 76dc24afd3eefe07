"""The harness's commands (``ripplekv eval``, ``report``, ``analyze``, ``tune``), added to ``ripplekv`` through its
``ripplekv.commands`` entry points.

They need the ``eval`` extra, so importing them without it fails here, at once, naming the missing module (which
``ripplekv`` turns into its install line), rather than after a model has loaded. The modules below are the extra's
(``tests/test_imports.py`` checks them against ``pyproject.toml``).
"""

import rouge  # noqa: F401  (LongBench's ROUGE-L)
import scipy.stats  # noqa: F401  (the paired tests, bootstrap and rank correlations)
