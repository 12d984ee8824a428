"""`python -m accelpact ...`: the `accelpact` command, for an environment without its script."""

import sys

from .cli import main

sys.exit(main())
