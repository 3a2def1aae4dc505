"""`python -m services.scheduler [flags]`: the same as `dsv4serve scheduler [flags]`."""
import sys

from services.cli import main

if __name__ == "__main__":
    sys.exit(main(["scheduler", *sys.argv[1:]]))
