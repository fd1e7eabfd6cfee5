"""Training diagnostics: cheap ones on by default (gradient norms, non-finite guard, data wait, W&B dashboard), costlier ones opt-in (configs/callbacks/diagnostics.yaml)."""
