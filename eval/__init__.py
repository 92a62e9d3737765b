"""Evaluation and analysis: lm-eval adapter (``eval.adapter``), runner (``eval.run``),
local-mirror tasks (``eval/tasks``). Importing ``eval.adapter`` registers the lm-eval
model ``"mhar"``."""
