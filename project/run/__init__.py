"""A run's life beyond one process: its plan, its folder, the checkpoint it continues, and checkpoints that a kill
cannot corrupt and that are read back safely.

`plan.plan_run` decides, before anything is built, what a command does (its folder, the checkpoint it continues,
its loggers' folders and W&B run); `resume` finds the run `--ckpt_path last` continues; `run_folder` claims and
locks the run's folder; `checkpoints` writes and reads checkpoints. The callbacks a run carries (run info, RNG
states, stopping on signals) are in `project.callbacks`, its W&B logger in `project.loggers`.
"""
