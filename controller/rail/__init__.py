"""RAIL (arXiv 2608.05080): a contextual-bandit controller of where and how to intervene in
rollout generation. One concept per module:

* ``config``      ``RailConfig``: every setting, validated
* ``arms``        the interventions (no-op, branch, resample) and their GroupActions and costs
* ``features``    the context a decision sees, and its sanitisation rule
* ``bandit``      the learner interface (``predict_one`` / ``learn_one``), ``Decision``, SquareCB
* ``vw_backend``, ``river_backend``, ``learners``  the two learners and the factory
* ``behaviour``   behaviour policies of shadow mode (none, ARPO-like)
* ``decider``     live vs shadow: who acts and what is logged
* ``buffers``     per-request prefix buffers for branching
* ``reward``      the realised reward of a decision
* ``promotion``   shadow-to-live promotion and demotion on doubly-robust evidence
* ``gain_error``  online vs frozen gain-prediction error
* ``points``      the decision points (rescue, extend, token), their batching, per-group records
* ``outcomes``    what decisions led to: rewards, learning, the frozen copy, promotion switches
* ``controller``  ``RailController``, the orchestrator-facing ``Controller``
* ``state``       saved state and its file form
* ``replay``      offline training and evaluation from traces
"""


# Nothing is imported here on purpose: ``controller.rail.config`` is read by every run's
# configuration, and the controller's modules pull in scipy/vowpalwabbit/river. Import
# ``controller.rail.controller.RailController`` where it is used.
