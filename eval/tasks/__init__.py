"""Local-mirror lm-eval task YAMLs (same names and prompts as lm-eval's stock tasks;
data from ``MHAR_DATA_DIR``). Loaded by ``eval.data_local.DataSource.task_manager``."""
