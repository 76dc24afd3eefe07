"""RippleKV's evaluation harness (``pip install 'ripplekv[eval]'``): suites, the run loop, reports, analysis.

Its layers and their import order are in ``docs/architecture.md`` (enforced by ``tests/test_imports.py``).
Nothing is imported here: import the modules by path.
"""
