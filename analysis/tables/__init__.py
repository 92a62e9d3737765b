"""Result tables, one module per table (table1, seeds, heads, downstream, cpt, cost), built and written by
``analysis.tables.build`` (``python -m analysis.tables``); ``render`` holds the table record and its writers."""
