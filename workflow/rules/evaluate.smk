# Downstream evaluation: one job per (run, task), so adding a benchmark evaluates
# only the new task. Evaluation settings are hashed into the path ({ehash}). Each job writes what the
# statistics read (results.json, samples.jsonl) and lm-eval's own files (lm_eval/<model>/results_<date>.json,
# samples_<task>_<date>.jsonl). Task names resolve through lm-eval's registry (stock tasks + eval/tasks +
# the config's tasks_dir); an unknown name stops the workflow when the DAG is built (common.smk).


rule evaluate:
    input:
        model=f"{RUN}/model.pt",
    output:
        results=f"{EVAL}/results.json",
        samples=f"{EVAL}/samples.jsonl",
        lm_eval=directory(f"{EVAL}/lm_eval"),
    log:
        f"{LOGS}/eval/{{variant}}/{{size}}/seed{{seed}}/{{rid}}/{{ehash}}/{{task}}.log",
    benchmark:
        f"{BENCHMARKS}/eval/{{variant}}/{{size}}/seed{{seed}}/{{rid}}/{{ehash}}/{{task}}.tsv"
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
