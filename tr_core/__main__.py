"""`python -m tr_core`: the command line of tr_core/cli/, the same as the installed `token-recycling` command."""
import sys

from .cli import main

sys.exit(main())
