"""Multi-label images: any number of tags per image, none included. `kind.Tags` is the kind of target (its
encoding, stratification, metric, decoding for deployment, dashboard panels and how a CSV writes tags);
`task.MultiLabelClassifier` trains a sigmoid per tag and picks each tag's threshold on validation."""

#: What this package adds to the core's seams (project.registry reads it without importing the package).
REGISTER = {
    "target_kinds": {"tags": ".kind:Tags"},
    "tasks": {"MultiLabelClassifier": ".task"},
}
