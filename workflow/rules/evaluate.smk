# Downstream evaluation: one job per (run, task), so adding a benchmark evaluates
# only the new task. Evaluation settings are hashed into the path ({ehash}).


rule evaluate:
    input:
        model=f"{RUN}/model.pt",
    output:
        results=f"{EVAL}/results.json",
        samples=f"{EVAL}/samples.jsonl",
    log:
        f"{LOGS}/eval/{{variant}}/{{size}}/seed{{seed}}/{{rid}}/{{ehash}}/{{task}}.log",
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
    script:
        "../scripts/evaluate.py"
