"""Replay, the wiring side: gates run offline on groups recorded once from a real model.

``logs.py`` opens a recorded group log of any format (railgate's own, TRL's, AReaL's, verl's)
with the tokenizer and group size the command line names; ``driver.py`` replays one gate on a
log directly over the real ``GroupTracker`` (``bench replay``'s fast path) and
``pipeline_run.py`` runs the whole pipeline over it (``engine.kind: replay``); both say what
they did with each recorded prompt (``pipeline.replay.outcome.PromptOutcome``). ``report.py``
and its siblings turn outcomes into ``bench replay``'s table.
"""
