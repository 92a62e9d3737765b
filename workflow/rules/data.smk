# Data: tokenize the corpus once (cached token shards) before any training job starts,
# so parallel runs never tokenize the same corpus twice. One job per results hash.


rule prepare_data:
    output:
        f"{RESULTS}/data/{{hash}}/shards.json",
    log:
        f"{LOGS}/data/{{hash}}.log",
    benchmark:
        f"{BENCHMARKS}/data/{{hash}}.tsv"
    conda:
        "../envs/train.yaml"
    resources:
        mem_mb=RES["mem_mb"],
        runtime=RES["runtime_min"],
    params:
        run_config=data_run_config,
    script:
        "../scripts/prepare_data.py"
