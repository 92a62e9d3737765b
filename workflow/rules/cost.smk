# Cost: the table of the benchmark records listed in cost.bench_files (committed GPU runs) is built by
# workflow/rules/tables.smk; with cost.run_benchmark, this rule also measures training throughput on this GPU.


rule bench_throughput:
    output:
        BENCH_CSV,
    log:
        f"{LOGS}/bench/{COST_HASH}/training.log",
    benchmark:
        f"{BENCHMARKS}/bench/{COST_HASH}/training.tsv"
    conda:
        "../envs/train.yaml"
    resources:
        **gpu_resources(1),
        runtime=RES["runtime_min"],
    params:
        sizes=COST.get("sizes", config["sizes"]),  # default: the Table 1 sizes
        providers=COST["providers"],
        heads=COST["heads"],
    script:
        "../scripts/bench.py"
