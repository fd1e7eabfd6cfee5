"""Run reliability: what lets a run survive kills, resume in place, load checkpoints safely and log offline.

`plan.plan_run` decides, before anything is built, what a command does (its folder, the checkpoint it continues,
its loggers' folders and W&B run); the rest are the pieces it and the CLI use. `lightning_private` is the one
place that touches Lightning's private API.
"""
