"""Run reliability: what lets a run survive kills, resume in place, load checkpoints safely and log offline.

Nothing here is needed to understand a `fit`: it is the layer under the CLI that keeps a run's folder whole.
`reliable_run.ReliableRunMixin` plugs it into the CLI; `lightning_private` is the one place that touches
Lightning's private API.
"""
