# Cost: tabulate the benchmark records listed in cost.bench_files (committed GPU runs);
# with cost.run_benchmark, also measure training throughput on this machine's GPU.


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


rule table_cost:
    input:
        csvs=bench_csvs(),
    output:
        table_report("cost"),
    log:
        f"{LOGS}/reports/{STUDY_HASH}/cost.log",
    benchmark:
        f"{BENCHMARKS}/reports/{STUDY_HASH}/cost.tsv"
    conda:
        "../envs/analysis.yaml"
    params:
        kind="cost",
        resamples=config["stats"]["resamples"],
        published=config.get("published", {}),
    script:
        "../scripts/table.py"
