"""Multi-turn text environments: the contract, running episodes safely, rendering them as tokens.

=====================  ===================================================================
``protocol``           the contract (SkyRL-Gym's): ``Class(env_config, extras)``, ``init``,
                       ``step``, ``close``; optional ``snapshot``/``restore``, ``max_turns``
``loading``            ``load_env_class("module:Class")`` with errors that name the fix
``config``             ``EnvConfig``: ``task.env`` in the YAML
``session``            ``EnvRunner`` (one per run) -> ``EnvSession`` (one per episode):
                       ``start``, ``step`` -> ``TurnResult``, ``fork(turns)``, ``close``;
                       never raises for the environment's faults
``hosts``, ``worker``  where env calls run (a thread, or a process that a timeout kills)
``checks``             what ``init``/``step`` return, checked
``render``             ``ChatRenderer`` (HF chat template) and ``PlainRenderer`` (the
                       character tokenizer): ``prompt_ids``, ``observation_ids``,
                       ``action_text``, ``action_ids``
``rows``               dataset rows in SkyRL's format (JSONL / Parquet)
``demos``              demonstration episodes for the warm start, and their SFT pairs
``chain``              ``ChainEnv``: chained arithmetic, learnable on a CPU, with feedback
``wordproblems``       generated GSM8K-style problems and ``WordProblemEnv``
``faulty``             ``FaultyEnv``: misbehaves on purpose, for tests
=====================  ===================================================================

How the core runs one episode (docs/envs.md has the whole story)::

    runner = EnvRunner(task.env)                       # once per run (or EnvTask.runner)
    row = env_task.row(prompt.prompt_id)               # prompt messages + extras
    session = runner.session(row.extras)               # in a worker thread from here on
    started = session.start(row.prompt)                # .error set: an environment failure
    context = renderer.prompt_ids(started.conversation)
    while True:
        turn_ids = <generate until renderer.stop_ids or the token cap>
        result = session.step(renderer.action_text(turn_ids))
        if result.done or result.error: break          # error: an environment failure
        context += turn_ids + renderer.observation_ids(result.observations)   # masked out of the loss
    reward = session.episode_reward; session.close()

This package imports nothing of ``controller/``, ``learner/`` or ``railgate/``; skyrl-gym is
never imported by it (its classes are loaded by name like any user's).
"""
