"""`python -m tasks COMMAND`: the operator CLI; the demo is `python -m devtools demo`."""

from __future__ import annotations

import sys

from tasks.cli.main import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
