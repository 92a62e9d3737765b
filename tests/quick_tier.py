"""The quick test tier: ``python -m pytest -m quick`` (tests/conftest.py marks these tests ``quick``).

One entry per test file, every package folder of tests/ contributing (tests/test_quick_tier.py checks that, and
that each name below exists): the file's tests are quick except those named (a function name, or one
parametrisation ``name[id]``) and those marked ``slow`` or ``gpu``. Chosen by measured duration (``--durations=0``):
pure functions, config and record checks, the import graph, the schema and label checks of the workflow (dry
runs only), the checkpoint-free parts of training, evaluation against Hugging Face on tiny models.
"""
from __future__ import annotations

QUICK: dict[str, tuple[str, ...]] = {
    "analysis/test_stats.py": (),
    "analysis/test_throughput.py": (),
    "analysis/test_stage_imports.py": (),
    "benchmarks/test_traffic_bound.py": (),
    "cpt/test_cpt.py": (),
    "data/test_data.py": (),
    "eval/test_eval_bos.py": ("test_loglikelihoods_match_hf[wikitext-2]",),
    "hf/test_hf_authors.py": (),
    "model/test_config.py": (),
    "model/test_presets.py": (),
    "runs/test_pairing.py": (),
    "runs/test_runconfig.py": (),
    "runs/test_runs.py": (),
    "scripts/test_migrate_run_layout.py": (),
    "training/test_step.py": ("test_step_with_fused_router_equals_eager_routing",),
    "workflow/test_workflow_inputs.py": (),
    "test_import_graph.py": (),
    "test_docs.py": (),
    "test_safe_yaml.py": (),
    "test_cli_messages.py": (),
    "test_results_files.py": (),
    "test_quick_tier.py": (),
}
