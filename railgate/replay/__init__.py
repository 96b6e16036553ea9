"""Replay, the wiring side: gates run offline on groups recorded once from a real model.

``logs.py`` opens a recorded group log of any format (railgate's own, TRL's, AReaL's, verl's)
with the tokenizer and group size the command line names; ``pipeline_run.py`` runs the real
pipeline over a log (``engine.kind: replay``) and says what it did with each recorded prompt
(``pipeline.replay.outcome.PromptOutcome``).
"""
