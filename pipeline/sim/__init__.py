"""The simulator: a seeded world of prompts whose success rates move with training (``world``),
an engine that streams simulated tokens on a virtual clock (``engine``) and the learner that moves
the world's policy (``learner``). Benchmarks of gates run here in seconds; nothing in it is used by
a real-model run."""
