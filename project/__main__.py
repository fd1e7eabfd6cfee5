import sys

if __name__ == "__main__":
    if sys.argv[1:] in ([], ["-h"], ["--help"]):  # answered without importing torch or Lightning
        from project import print_commands

        print_commands()
    else:
        from project.cli import main

        main()
