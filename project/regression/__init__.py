"""Real values per image (regression: an angle, an age, a count). `kind.Values` is the kind of target (its
encoding, stratification by quantile bins, metric, decoding for deployment, dashboard panels and how a CSV writes
values); `task.ImageRegressor` trains one output per value on the values standardised by the training part."""

#: What this package adds to the core's seams (project.registry reads it without importing the package).
REGISTER = {
    "target_kinds": {"values": ".kind:Values"},
    "tasks": {"ImageRegressor": ".task"},
}
