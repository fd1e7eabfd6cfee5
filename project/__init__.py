"""A PyTorch Lightning starter template for image classification: `python -m project --help` lists its commands.

The table of commands lives here, where it costs nothing to import: `python -m project --help` prints it
without loading torch or Lightning (seconds), which only the command that runs needs.
"""

__version__ = "0.1.0"

#: LightningCLI's subcommands (project.cli.ProjectCLI) and what they do (the Trainer methods' own summaries).
SUBCOMMANDS = {
    "fit": "Runs the full optimization routine.",
    "validate": "Perform one evaluation epoch over the validation set.",
    "test": "Perform one evaluation epoch over the test set.",
    "predict": "Run inference on your data.",
}

#: Tool commands beside them: name -> ("module:function", summary). Each function takes the remaining
#: command-line arguments (list[str]) and parses them itself (jsonargparse).
TOOLS = {
    "export": ("project.export.model_export:main", "export a checkpoint to ONNX and/or TorchScript"),
    "quantize": ("project.export.quantize:main", "INT8 quantization report: accuracy, latency, size"),
    "serve": ("project.serve.server:main", "HTTP prediction endpoint (LitServe)"),
    "predict_onnx": ("project.export.predict_onnx:main", "batched inference from an exported ONNX model"),
    "cv": ("project.studies.cv:main", "k-fold cross-validation: one fit per fold, then the table"),
    "tune": ("project.studies.tune:main", "hyperparameter search with Optuna: one fit per trial"),
    "prepare": ("project.data.prepare:main", "convert image files into litdata chunks for streaming"),
}

USAGE = "python -m project"


def print_commands() -> None:
    """The top-level help: every command with its summary."""
    print(f"usage: {USAGE} [-h] <command> [--config CONFIG] [--KEY VALUE ...]\n")
    print(f"Training and evaluation (LightningCLI; {USAGE} <command> --help lists every option):")
    for name, summary in SUBCOMMANDS.items():
        print(f"  {name:<13} {summary}")
    print(f"\nTools ({USAGE} <tool> --help):")
    for name, (_, summary) in TOOLS.items():
        print(f"  {name:<13} {summary}")
