"""The analysis stage (torch-free; workflow/envs/analysis.yaml): loaders (``analysis.load``), the tables
(``analysis.tables``), statistics (``analysis.stats``), verdicts (``analysis.verdict``), figures
(``analysis.figures``) and the report (``analysis.report``). It reads the files the training and evaluation
stages wrote and never imports torch, lm-eval or ``eval`` (tests/analysis/test_stage_imports.py)."""
