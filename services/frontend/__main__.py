"""`python -m services.frontend [flags]`: the same as `dsv4serve frontend [flags]`."""
import sys

from services.cli import main

if __name__ == "__main__":
    sys.exit(main(["frontend", *sys.argv[1:]]))
