import atexit
import contextlib
import os
import signal
import sys
import threading


def exit_without_teardown(code: int) -> None:
    """End the process as Python's own exit would, minus the module teardown: threads joined, atexit handlers
    run (logging, multiprocessing's children, W&B), output flushed, then `os._exit`. Destroying the modules of
    torch, torchvision and Lightning is a noticeable share of a short command's wall time and writes nothing;
    every file of a run is already written and closed when the command returns.

    A Ctrl-C from here on (a study's Ctrl-C reaching a fit that has just finished) has nothing left to stop:
    it ends the process at once with the command's code, instead of raising KeyboardInterrupt inside an
    atexit handler, which Python reports as a traceback."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, lambda signum, frame: _flush_and_exit(code))
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # what the interpreter's exit calls (a private name; tests/test_cli.py pins it)
    _flush_and_exit(code)


def _flush_and_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        # a closed pipe, or a flush interrupted by the signal: nothing more to write
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            stream.flush()
    os._exit(code)


def run() -> None:
    if sys.argv[1:] in ([], ["-h"], ["--help"]):  # answered without importing torch or Lightning
        from project import print_commands

        print_commands()
        return
    from project import SUBCOMMANDS
    from project.run.startup import pause_garbage_collection

    if sys.argv[1] in SUBCOMMANDS:  # resumed as the Trainer starts (project.cli.commands)
        pause_garbage_collection()
    from project.cli import main

    try:
        main()
    except SystemExit as stop:  # the one-line errors: exit codes, or a message for argparse's usage errors
        if stop.code is not None and not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
        exit_without_teardown(stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1))
    exit_without_teardown(0)  # an uncaught exception (a bug) is not caught: Python prints its traceback


if __name__ == "__main__":
    run()
