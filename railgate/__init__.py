"""Wiring of railgate's packages into runnable jobs (train, bench, ...); ``run.py`` is its CLI.

pipeline/, controller/ and learner/ do not import each other in circles; this package is the
one place that knows all three.
"""
