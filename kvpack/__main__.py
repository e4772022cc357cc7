import sys

from kvpack.entrypoints.cli import main

sys.exit(main())
