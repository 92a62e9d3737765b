"""Loaders of the analysis stage, one module per kind of input: ``runs`` (summary.json and run identity),
``metrics`` (metrics.jsonl), ``samples`` (evaluation outputs), ``bench`` (benchmark CSVs), ``published``
(published numbers by source), ``provenance``; ``common`` holds the error type and safe readers."""
