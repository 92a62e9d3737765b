# Data: tokenize the corpus once (cached token shards) before any training job starts,
# so parallel runs never tokenize the same corpus twice. One job per data key (mhar.runs.layout.data_key:
# the data section without the data-order seed, and the vocabulary size); its threads are the
# tokenizer's worker processes, and a killed job resumes its partial build when rerun.


rule prepare_data:
    output:
        f"{RESULTS}/data/{{dkey}}/shards.json",
    log:
        f"{LOGS}/data/{{dkey}}.log",
    benchmark:
        f"{BENCHMARKS}/data/{{dkey}}.tsv"
    conda:
        "../envs/train.yaml"
    threads: RES["threads_per_run"]  # tokenizer worker processes (mhar.data.shards.build_shards)
    resources:
        mem_mb=RES["mem_mb"],
        runtime=RES["runtime_min"],
    params:
        run_config=data_run_config,
    script:
        "../scripts/prepare_data.py"
