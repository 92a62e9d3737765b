"""Result tables, one module per table (table1, seeds, heads, downstream, cpt, cost), built and written by
``eval.tables.build`` (``python -m eval.tables``); ``render`` holds the table record and its writers."""
