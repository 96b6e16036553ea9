"""The policies the side-by-side benchmarks compare, each as the config overrides that make it.

An allocation policy is a gate (``gate.kind``, sometimes with a launch mode); the intervention
policies of RAIL are SARA plus a controller:

* ``sara_arpo`` -- the ARPO-like heuristic acting (branch at high-entropy tokens, rescue
  saturated probes), deterministic (``behaviour_epsilon=0``); the learned controller only
  watches.
* ``sara_rail`` -- the learned controller acting from the first decision and learning online.
* ``sara_rollouts`` -- SARA with a learner step of ``batch_groups * group_size`` rollouts
  generated (``orchestrator.batch_rollouts=auto``): abandoned probes count toward the step they
  were spent in, so it takes GRPO's number of optimiser steps for the same budget. Every other
  policy runs with a step of ``batch_groups`` committed groups (``base_overrides``), whatever the
  base config says, unless a ``--set`` says otherwise.
* ``sara_dps_rollouts`` -- SARA on DPS-selected prompts with the same learner step of rollouts.
* ``sara_level`` -- SARA with a probe of two and each group's prior fitted to the recent groups
  of its prompt's difficulty level (``controller.level_prior``; our extension).
* ``sara_pilot`` -- SARA whose probe starts with one rollout and which abandons a group whose
  agreeing rollouts the policy wrote with near certainty (``gate.sara.confident_pilot``; our
  extension).
* ``sara_ref`` -- SARA whose groups start from the policy's likelihood of the prompt's reference
  response, scored by the learner before any rollout, and which skips prompts that prior says
  will not give an effective group (``gate.sara.reference_prior``; our extension).
* ``sara_ref_rollouts`` -- ``sara_ref`` with a learner step of rollouts generated, as ``sara_rollouts``.
* ``sara_ref_skip`` -- ``sara_ref`` that opens only prompts whose group the prior gives a chance
  above 0.8 of coming out mixed (``gate.sara.reference_skip``): skips cost no rollouts.
* ``sara_ref_skip_rollouts`` -- ``sara_ref_skip`` with a learner step of rollouts generated.
* ``sara_guide`` -- SARA that launches the rest of an all-wrong probe from the first half of the
  prompt's reference response instead of abandoning it (``gate.sara.guidance=0.5``), the fixed
  rule "always guide all-wrong groups at 50%"; no reference prior (it would commit those probes).
* ``sara_ref_skip_guide`` -- ``sara_ref_skip`` with guidance at 50%: the screen still skips the
  prompts it expects the policy to pass, but opens the hard ones it would skip when they have a
  reference, and their all-wrong probes are guided.
* ``sara_guide_anneal`` -- ``sara_guide`` at 50% until learner step 320 and 25% after (QuestA's
  schedule; 320 is half of the 8-group benchmark's 640 steps: set
  ``gate.sara.guidance_anneal_step`` for another length).
* ``sara_rail_guide`` -- the learned controller choosing, at each all-failed rescue of a prompt
  with a reference, between abandoning and guiding the group's next 4 rollouts from 25%, 50% or
  75% of the reference (``controller.rail.guide_levels``), live from the first decision, with
  no other arms. A rollout is priced at ``cost_lambda=0.02``, about the reward variance a
  rollout of a fresh group of 8 buys (a mixed group's variance of 0.1-0.25 over 8 rollouts).
* ``sara_rail_guide_s2l`` -- the same arms, shadow-to-live: the fixed rule (guide at 50%, with
  exploration) acts until the doubly-robust bound says the learned policy is better.
* ``sara_rail_s2l`` -- shadow-to-live: the heuristic acts (with exploration) until the
  doubly-robust lower bound says the learned policy is better, then the learned policy acts.

>>> overrides("sara_eager")
['gate.kind=sara', 'gate.sara.launch=eager']
>>> overrides("uniform")
['gate.kind=uniform']
>>> overrides("nope")
Traceback (most recent call last):
...
pipeline.config.build.ConfigError: unknown policy 'nope'; choose from uniform, ds, pilot_commit, hora, sara, sara_rollouts, sara_dps_rollouts, sara_eager, sara_stream, sara_level, sara_pilot, sara_ref, sara_ref_rollouts, sara_ref_skip, sara_ref_skip_rollouts, sara_guide, sara_ref_skip_guide, sara_guide_anneal, dps, sara_dps, oracle, trl_default, sara_arpo, sara_rail, sara_rail_s2l, sara_rail_guide, sara_rail_guide_s2l
"""

from __future__ import annotations

from pipeline.config.build import ConfigError

_RAIL = ("gate.kind=sara", "controller.kind=rail")
_RAIL_GUIDE = _RAIL + (
    "controller.rail.branch_sizes=[]",
    "controller.rail.resample_sizes=[]",
    "controller.rail.token_decisions=false",
    "controller.rail.extend_on_commit=false",
    "controller.rail.guide_levels=[0.25,0.5,0.75]",
    "controller.rail.cost_lambda=0.02",
)

TRL_DEFAULT = (
    "gate.kind=sara",
    "gate.sara.tau_commit=0.5",
    "gate.sara.tau_abandon=0.45",
    "gate.sara.reference_prior=true",
    "gate.sara.reference_skip=0.45",
    "gate.sara.reference_skip_share=0.5",
    "gate.sara.reference_calibrate=true",
    "gate.sara.probe_when=pays",
    "gate.sara.reference_strength=64.0",
    "gate.sara.reference_ahead=0",
    "gate.sara.whole_when_certain=true",
    "replay.reference_exact=false",
    "orchestrator.max_async_steps=0",
    "orchestrator.max_concurrent_samples=1048576",
    "orchestrator.max_open_groups=1048576",
)
"""``trl_default``: ``GatedGRPOConfig()``'s gate (``railgate.trl.config.gate_config`` with every
``gate_*`` field at its default; the orchestrator as ``railgate.trl.session.orchestrator_config``
sets it): SARA with a calibrated reference prior (not exact), a skip at 0.45 and the probing rule
(``probe_when: pays``). Its probe is half the group (``trl_probe_size``; ``sized_overrides`` adds it).
tests/test_bench_replay_trl_default.py checks it against ``GatedGRPOConfig``."""

POLICIES: dict[str, tuple[str, ...]] = {
    "uniform": ("gate.kind=uniform",),
    "ds": ("gate.kind=ds",),
    "pilot_commit": ("gate.kind=pilot_commit",),
    "hora": ("gate.kind=hora",),
    "sara": ("gate.kind=sara",),
    "sara_rollouts": ("gate.kind=sara", "orchestrator.batch_rollouts=auto"),
    "sara_dps_rollouts": ("gate.kind=sara_dps", "orchestrator.batch_rollouts=auto"),
    "sara_eager": ("gate.kind=sara", "gate.sara.launch=eager"),
    "sara_stream": ("gate.kind=sara", "gate.sara.launch=streaming"),
    "sara_level": ("gate.kind=sara", "gate.sara.probe_size=2", "gate.sara.level_prior=true"),
    "sara_pilot": ("gate.kind=sara", "gate.sara.confident_pilot=true"),
    "sara_ref": ("gate.kind=sara", "gate.sara.reference_prior=true"),
    "sara_ref_rollouts": ("gate.kind=sara", "gate.sara.reference_prior=true", "orchestrator.batch_rollouts=auto"),
    "sara_ref_skip": ("gate.kind=sara", "gate.sara.reference_prior=true", "gate.sara.reference_skip=0.8"),
    "sara_ref_skip_rollouts": (
        "gate.kind=sara",
        "gate.sara.reference_prior=true",
        "gate.sara.reference_skip=0.8",
        "orchestrator.batch_rollouts=auto",
    ),
    "sara_guide": ("gate.kind=sara", "gate.sara.guidance=0.5"),
    "sara_ref_skip_guide": (
        "gate.kind=sara",
        "gate.sara.reference_prior=true",
        "gate.sara.reference_skip=0.8",
        "gate.sara.guidance=0.5",
    ),
    "sara_guide_anneal": ("gate.kind=sara", "gate.sara.guidance=0.5", "gate.sara.guidance_anneal_step=320"),
    "dps": ("gate.kind=dps",),
    "sara_dps": ("gate.kind=sara_dps",),
    "oracle": ("gate.kind=oracle",),
    "trl_default": TRL_DEFAULT,
    "sara_arpo": _RAIL
    + (
        "controller.rail.mode=shadow",
        "controller.rail.behaviour=arpo",
        "controller.rail.behaviour_epsilon=0.0",
        "controller.rail.auto_promote=false",
    ),
    "sara_rail": _RAIL + ("controller.rail.mode=live", "controller.rail.auto_promote=false"),
    "sara_rail_s2l": _RAIL + ("controller.rail.mode=shadow", "controller.rail.auto_promote=true"),
    "sara_rail_guide": _RAIL_GUIDE + ("controller.rail.mode=live", "controller.rail.auto_promote=false"),
    "sara_rail_guide_s2l": _RAIL_GUIDE
    + ("controller.rail.mode=shadow", "controller.rail.behaviour=guide", "controller.rail.auto_promote=true"),
}

SIM_ALLOCATION = (
    "uniform",
    "ds",
    "pilot_commit",
    "hora",
    "sara",
    "sara_eager",
    "sara_stream",
    "dps",
    "sara_dps",
    "oracle",
)
"""``bench allocation`` on the simulator: every allocation policy and launch mode."""
MODEL_ALLOCATION = ("uniform", "ds", "pilot_commit", "hora", "sara", "sara_rollouts", "sara_dps", "oracle")
"""``bench allocation`` on a real model (each run costs minutes): the policies the issue names."""
RAIL = ("uniform", "sara", "sara_arpo", "sara_rail", "sara_rail_s2l", "oracle")
"""``bench rail``: SARA alone, with the heuristic, with the learned controller; GRPO and the floor."""


STEP_BY_ROLLOUTS = frozenset(
    p for p, sets in POLICIES.items() if any(s.startswith("orchestrator.batch_rollouts=") for s in sets)
)
"""Policies that set their own learner step (``sara_rollouts``, ``sara_dps_rollouts``: ``batch_rollouts=auto``)."""


REFERENCE_PRIOR = frozenset(p for p, sets in POLICIES.items() if "gate.sara.reference_prior=true" in sets)
"""Policies with SARA's reference prior (``sara_ref``, ``sara_ref_rollouts``)."""


def base_overrides(policy: str) -> list[str]:
    """What keeps ``policy`` itself whatever the base config says, put before the run's own
    ``--set`` overrides: a step of committed groups for every policy but those in
    ``STEP_BY_ROLLOUTS`` (which carry ``batch_rollouts=auto`` themselves), and no reference prior
    for every policy but those in ``REFERENCE_PRIOR``, so the CPU default's ``batch_rollouts:
    auto`` and ``reference_prior: true`` do not turn the published ``sara`` into ``sara_ref_rollouts``.

    >>> base_overrides("sara"), base_overrides("sara_ref_rollouts")
    (['orchestrator.batch_rollouts=0', 'gate.sara.reference_prior=false'], [])
    """
    out = [] if policy in STEP_BY_ROLLOUTS else ["orchestrator.batch_rollouts=0"]
    return out + ([] if policy in REFERENCE_PRIOR else ["gate.sara.reference_prior=false"])


def overrides(policy: str) -> list[str]:
    """The ``--set`` overrides that make ``policy``."""
    if policy not in POLICIES:
        raise ConfigError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    return list(POLICIES[policy])


def trl_probe_size(group_size: int) -> int:
    """``GatedGRPOConfig.probe_size`` with ``gate_probe_size=0``: half the group, at least 1.

    >>> trl_probe_size(8), trl_probe_size(3)
    (4, 1)
    """
    return max(1, group_size // 2)


def sized_overrides(policy: str, group_size: int) -> list[str]:
    """The overrides of ``policy`` that follow the group size: ``trl_default``'s probe (half the
    group, as ``GatedGRPOConfig`` derives it); none for the others.

    >>> sized_overrides("trl_default", 16), sized_overrides("sara", 16)
    (['gate.sara.probe_size=8'], [])
    """
    return [f"gate.sara.probe_size={trl_probe_size(group_size)}"] if policy == "trl_default" else []


def order(policy: str) -> int:
    """Table and legend order."""
    names = list(POLICIES)
    return names.index(policy) if policy in names else len(names)
