# Released checkpoints as downstream arms (config `released:`): each is imported once (python -m mhar import-hf:
# stock Qwen3 / Llama, our exports, the authors' Qwen3-AttnRes) into results/released/<label>/model.pt, with a
# run block {label, residual, size, seed 0, pairing "released-<group>"}, then evaluated per task like a run;
# the downstream table pairs each arm with the baseline arm of its size label and group (same questions).

RELEASED = {
    label: {
        "size": "released",
        "group": "released",
        "tokenizer": None,
        "revision": None,
        **arm,
    }
    for label, arm in (config.get("released") or {}).items()
}
RELEASED_MODEL = f"{RESULTS}/released/{{label}}/model.pt"
RELEASED_EVAL = f"{RESULTS}/eval/released/{{label}}/{{ehash}}/{{task}}"
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
    script:
        "../scripts/evaluate.py"
