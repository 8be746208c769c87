"""`python -m specops.bench ...` is `specops bench ...`."""

import sys

from specops.bench import main

raise SystemExit(main(sys.argv[1:]))
