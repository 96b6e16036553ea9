"""Replay, the wiring side: opening a recorded group log of any format (``logs``: railgate's
own, TRL's, AReaL's, verl's) with the tokenizer and group size the command line names, so that
gates can be replayed offline on exactly the samples a real model produced."""
