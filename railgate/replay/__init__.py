"""Replaying gates on recorded groups (``pipeline.replay``): ``bench replay``'s direct driver
(``driver``), the one-pass prompt pool it presents the replayed prompts through (``pool``), and
the report of what each gate did (``report``)."""
