"""``python -m mhar.cpt``."""
import sys

from .cli import main

sys.exit(main())
