"""Replay: gates run on groups recorded once from a real model (``pipeline.store.grouplog``).

``order.py`` says which recorded group a replayed prompt is and which recorded sample serves
each request of its group, under a seeded order; the replay engine (``pipeline.engines.replay``)
and ``bench replay``'s driver both serve samples through it, so they see the same samples.
"""
