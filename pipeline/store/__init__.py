"""What a run keeps on disk: Arrow IPC segment files (``arrowio``), the rollout buffer the learner's
batches are written to (``buffer``) and the decision trace (``tracelog``)."""
