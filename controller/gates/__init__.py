"""Allocation gates: which prompts get groups and when a group commits or is abandoned.

Every gate implements ``pipeline.protocols.Gate``; ``controller.gates.registry`` builds one
from a ``controller.config.GateConfig``.
"""
