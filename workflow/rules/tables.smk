# Tables: generated from run summaries / evaluation outputs, never edited by hand.
# Each writes <reports>/<name>.{md,csv,tex} through analysis.tables. The downstream table reads the
# per-question samples itself (there is no separate paired-stats step): its verdicts need the
# whole family (Holm across rows) and, with several seeds, every seed at once (seed-level test).


rule table1:
    input:
        summaries=table1_summaries(),
    output:
        table_report("table1"),
    log:
        f"{LOGS}/reports/{STUDY_HASH}/table1.log",
    benchmark:
        f"{BENCHMARKS}/reports/{STUDY_HASH}/table1.tsv"
    conda:
        "../envs/analysis.yaml"
    params:
        kind="table1",
        resamples=config["stats"]["resamples"],
        published=config.get("published", {}),
    script:
        "../scripts/table.py"


rule table_seeds:
    input:
        summaries=table1_summaries(),
    output:
        table_report("seeds"),
    log:
        f"{LOGS}/reports/{STUDY_HASH}/seeds.log",
    benchmark:
        f"{BENCHMARKS}/reports/{STUDY_HASH}/seeds.tsv"
    conda:
        "../envs/analysis.yaml"
    params:
        kind="seeds",
        resamples=config["stats"]["resamples"],
        published=config.get("published", {}),
    script:
        "../scripts/table.py"


rule table_heads:
    input:
        summaries=heads_summaries(),
    output:
        table_report("heads"),
    log:
        f"{LOGS}/reports/{STUDY_HASH}/heads.log",
    benchmark:
        f"{BENCHMARKS}/reports/{STUDY_HASH}/heads.tsv"
    conda:
        "../envs/analysis.yaml"
    params:
        kind="heads",
        resamples=config["stats"]["resamples"],
        published=config.get("published", {}),
    script:
        "../scripts/table.py"


rule table_downstream:
    input:
        results=downstream_results() + RELEASED_RESULTS,
    output:
        table_report("downstream"),
    log:
        f"{LOGS}/reports/{STUDY_HASH}/downstream.log",
    benchmark:
        f"{BENCHMARKS}/reports/{STUDY_HASH}/downstream.tsv"
    conda:
        "../envs/analysis.yaml"
    params:
        kind="downstream",
        resamples=config["stats"]["resamples"],
        published=config.get("published", {}),
    script:
        "../scripts/table.py"
