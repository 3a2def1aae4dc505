import sys

from services.demo.train_cli import main

sys.exit(main(sys.argv[1:]))
