"""`python -m devtools demo [...]`: the demo of the main job (`make demo`)."""

from __future__ import annotations

import sys

from devtools.demo import main as demo

if __name__ == "__main__":
    if sys.argv[1:2] != ["demo"]:
        sys.exit("usage: python -m devtools demo [--help]")
    sys.exit(demo(sys.argv[2:]))
