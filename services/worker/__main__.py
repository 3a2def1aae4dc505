"""`python -m services.worker [flags]`: the same as `dsv4serve worker [flags]`."""
import sys

from services.cli import main

if __name__ == "__main__":
    sys.exit(main(["worker", *sys.argv[1:]]))
