"""``ripplekv report``: run summaries, statistics, significance, tables, JSON and plots. No module imports torch.

Nothing is imported here: import the modules by path.
"""
