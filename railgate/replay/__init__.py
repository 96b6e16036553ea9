"""Replay: gates run on groups recorded once from a real model (``pipeline.store.grouplog``).

``pipeline_run.py`` runs the real pipeline over a log (``engine.kind: replay``) and says what it
did with each recorded prompt (``pipeline.replay.outcome.PromptOutcome``).
"""
