# Training: one job per (variant label, size, seed); the hash in the path is the
# config's (checked_run_config refuses any other), so results are never overwritten.


rule train:
    input:
        shards=f"{RESULTS}/data/{{hash}}/shards.json",
    output:
        summary=f"{RUN}/summary.json",
        metrics=f"{RUN}/metrics.jsonl",
        model=f"{RUN}/model.pt",
    log:
        f"{LOGS}/train/{{hash}}/{{variant}}/{{size}}/seed{{seed}}.log",
    conda:
        "../envs/train.yaml"
    threads: RES["threads_per_run"]
    resources:
        **gpu_resources(RES["gpus_per_run"]),
        mem_mb=RES["mem_mb"],
        runtime=RES["runtime_min"],
    params:
        run_config=checked_run_config,
        gpus=RES["gpus_per_run"],
    script:
        "../scripts/train.py"
