"""``python -m mhar.cpt``."""
import sys

from mhar.cpt.cli import main

sys.exit(main())
