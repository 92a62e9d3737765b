# Released checkpoints as downstream arms (config `released:`, e.g. config/released.yaml): each is imported once
# (python -m mhar import-hf: stock Qwen3 / Llama, our exports, the authors' checkpoints) into
# results/released/<label>/model.pt, its source pinned (hub: the commit read; local folder: its content hash) in
# the run block {label, residual, size, seed 0, pairing "released-<group>", source} and provenance.json, then
# evaluated per task like a run. The downstream table pairs each arm with the baseline arm of its size label and
# group (same questions); reproduce_released writes <reports>/released.{md,csv,tex} (analysis/tables/released.py, rule table): each arm
# beside the numbers its authors published (released.<label>.published names the source), and the paired tests.

RELEASED = {
    label: {
        "size": "released",
        "group": "released",
        "tokenizer": None,
        "revision": None,
        "published": None,
        **arm,
    }
    for label, arm in (config.get("released") or {}).items()
}
# local paths and published choices are checked before anything is planned
check_released_arms(RELEASED)
RELEASED_MODEL = f"{RESULTS}/released/{{label}}/model.pt"
RELEASED_EVAL = f"{RESULTS}/eval/released/{{label}}/{{ehash}}/{{task}}"
RELEASED_EVAL_DIRS = [
    str(Path(RELEASED_EVAL).parent).format(label=label, ehash=EHASH)
    for label in RELEASED
]
RELEASED_RESULTS = [
    f"{RELEASED_EVAL}/results.json".format(label=label, ehash=EHASH, task=task)
    for label in RELEASED
    for task in DS["tasks"]
]


rule import_released:
    output:
        model=f"{RESULTS}/released/{{label}}/model.pt",
    log:
        f"{LOGS}/released/{{label}}/import.log",
    benchmark:
        f"{BENCHMARKS}/released/{{label}}/import.tsv"
    conda:
        "../envs/eval.yaml"
    threads: RES["threads_per_run"]
    resources:
        mem_mb=RES["mem_mb"],
    params:
        arm=lambda w: RELEASED[w.label],
    script:
        "../scripts/import_released.py"


rule evaluate_released:
    input:
        model=RELEASED_MODEL,
    output:
        results=f"{RELEASED_EVAL}/results.json",
        samples=f"{RELEASED_EVAL}/samples.jsonl",
        lm_eval=directory(f"{RELEASED_EVAL}/lm_eval"),
    log:
        f"{LOGS}/eval/released/{{label}}/{{ehash}}/{{task}}.log",
    benchmark:
        f"{BENCHMARKS}/eval/released/{{label}}/{{ehash}}/{{task}}.tsv"
    conda:
        "../envs/eval.yaml"
    threads: RES["threads_per_run"]
    resources:
        **gpu_resources(RES["eval_gpus"]),
        mem_mb=RES["mem_mb"],
        runtime=RES["eval_runtime_min"],
    params:
        subset=DS["subset"],
        batch_size=DS["batch_size"],
        device=DS["device"],
        bootstrap_iters=DS["bootstrap_iters"],
        tasks_dir=TASKS_DIR,
        wandb_args=eval_wandb_args,
    script:
        "../scripts/evaluate.py"
