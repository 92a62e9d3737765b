"""``python -m analysis.tables``: see analysis.tables.build."""
import sys

from analysis.tables.build import main

sys.exit(main())
