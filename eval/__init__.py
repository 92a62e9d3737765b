"""The evaluation stage (torch + lm-eval; workflow/envs/eval.yaml): lm-eval adapter (``eval.adapter``), runner
(``eval.run``), per-document records (``eval.records``), local-mirror tasks (``eval/tasks``), the mechanism probe
(``eval.probe``) and the CPT arms' evaluation (``eval.cpt``). Importing ``eval.adapter`` registers the lm-eval
model ``"mhar"``. Tables, statistics and figures are the analysis stage (``analysis/``)."""
