"""A PyTorch Lightning starter template for image classification: `python -m project --help` lists its commands.

The table of commands lives here, where it costs nothing to import: `python -m project --help` prints it
without loading torch or Lightning (seconds), which only the command that runs needs. The tool commands are
found, not listed: each part registers its own (project.registry reads the tables as text), so a part deleted
takes its commands with it.
"""

__version__ = "0.1.0"

#: This package's import name, for what must name it at run time (`python -m <package>`, the logger); a renamed
#: copy of the template changes no string.
PACKAGE = __name__

#: The commands LightningCLI parses (project.cli.commands) and what they do (the Trainer methods' own summaries).
SUBCOMMANDS = {
    "fit": "Runs the full optimization routine.",
    "validate": "Perform one evaluation epoch over the validation set.",
    "test": "Perform one evaluation epoch over the test set.",
    "predict": "Run inference on your data.",
}

#: How the commands are started.
USAGE = f"python -m {PACKAGE}"


def __getattr__(name: str) -> dict[str, tuple[str, str]]:
    """`TOOLS`: the tool commands beside the subcommands, name -> ("module:function", summary), as the packages
    present register them (project.registry). Each function takes the remaining command-line arguments
    (list[str]) and parses them itself."""
    if name == "TOOLS":
        from project.registry import command_summaries, registered

        return {name: (target, command_summaries()[name]) for name, target in registered("commands").items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def print_commands() -> None:
    """The top-level help: every command with its summary."""
    print(f"usage: {USAGE} [-h] <command> [--config CONFIG] [--KEY VALUE ...]\n")
    print(f"Training and evaluation (LightningCLI; {USAGE} <command> --help lists every option):")
    for name, summary in SUBCOMMANDS.items():
        print(f"  {name:<13} {summary}")
    tools = __getattr__("TOOLS")
    if tools:
        print(f"\nTools ({USAGE} <tool> --help):")
    for name, (_, summary) in tools.items():
        print(f"  {name:<13} {summary}")
