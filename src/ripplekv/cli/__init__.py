"""The ``ripplekv`` command line."""
