"""Regenerate the current results pages (docs/results/<benchmark>_<machine>.md and .csv) from the
raw runs in docs/results/runs/; ``--check`` writes nothing and exits 1 if a committed page differs.

    python bench/pages.py [--root docs/results] [--check]
"""

import sys

from sweepbench.report.pages import main

if __name__ == "__main__":
    sys.exit(main())
