"""`kubeckpt` (also `kubectl kubeckpt`): the user's view of training jobs that kubeckpt serves.

It reads what the add-on keeps in the cluster (TrainingProgress objects, the jobs' Events and pods)
with the project's own asyncio client (reconciler/), and lists checkpoints through the rank-0 pod
(`python -m trainer_runtime.listing`, over pods/exec), since only the pod sees its storage; for a
job without one, through a short-lived lister pod, or from a local path (`--storage`).
"""
