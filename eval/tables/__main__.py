"""``python -m eval.tables``: see eval.tables.build."""
import sys

from eval.tables.build import main

sys.exit(main())
