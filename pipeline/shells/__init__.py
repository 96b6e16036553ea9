"""The shells that drive the core with IO: the async shell (``orchestrator``) and the round driver
for batched generators (``rounds``), their handler tables (``handlers``), the learner's side of a
run (``learning``, ``learner_timing``) and the parts a run is built from (``parts``).
"""
