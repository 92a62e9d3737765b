# Training: one job per run; the identity in the path is the config's (checked_run_config
# refuses any other), so a changed definition is a new directory. The outputs are
# protected: a finished run is never deleted by a rerun (Snakemake stops and says so;
# not for root, for whom a forced rerun rebuilds the records from the final checkpoint).


rule train:
    input:
        shards=train_shards,
    output:
        summary=protected(f"{RUN}/summary.json"),
        metrics=protected(f"{RUN}/metrics.jsonl"),
        model=protected(f"{RUN}/model.pt"),
    log:
        f"{LOGS}/train/{{variant}}/{{size}}/seed{{seed}}/{{rid}}.log",
    benchmark:
        f"{BENCHMARKS}/train/{{variant}}/{{size}}/seed{{seed}}/{{rid}}.tsv"
    conda:
        "../envs/train.yaml"
    threads: RES["threads_per_run"]
    resources:
        **gpu_resources(RES["gpus_per_run"]),
        mem_mb=RES["mem_mb"],
        runtime=RES["runtime_min"],
    params:
        run_config=train_run_config,
        gpus=lambda wildcards, output: RES["gpus_per_run"],
    script:
        "../scripts/train.py"
