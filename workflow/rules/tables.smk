# Tables: generated from run summaries / evaluation outputs, never edited by hand.
# Each writes <reports>/<name>.{md,csv,tex} through eval.tables. The downstream table reads the
# per-question samples itself (there is no separate paired-stats step): its verdicts need the
# whole family (Holm across rows) and, with several seeds, every seed at once (seed-level test).


rule table1:
    input:
        summaries=table1_summaries(),
    output:
        multiext(f"{REPORTS}/table1", ".md", ".csv", ".tex"),
    log:
        f"{LOGS}/reports/table1.log",
    conda:
        "../envs/analysis.yaml"
    params:
        kind="table1",
        resamples=config["stats"]["resamples"],
    script:
        "../scripts/table.py"


rule table_seeds:
    input:
        summaries=table1_summaries(),
    output:
        multiext(f"{REPORTS}/seeds", ".md", ".csv", ".tex"),
    log:
        f"{LOGS}/reports/seeds.log",
    conda:
        "../envs/analysis.yaml"
    params:
        kind="seeds",
        resamples=config["stats"]["resamples"],
    script:
        "../scripts/table.py"


rule table_heads:
    input:
        summaries=heads_summaries(),
    output:
        multiext(f"{REPORTS}/heads", ".md", ".csv", ".tex"),
    log:
        f"{LOGS}/reports/heads.log",
    conda:
        "../envs/analysis.yaml"
    params:
        kind="heads",
        resamples=config["stats"]["resamples"],
    script:
        "../scripts/table.py"


rule table_downstream:
    input:
        results=downstream_results() + RELEASED_RESULTS,
    output:
        multiext(f"{REPORTS}/downstream", ".md", ".csv", ".tex"),
    log:
        f"{LOGS}/reports/downstream.log",
    conda:
        "../envs/analysis.yaml"
    params:
        kind="downstream",
        resamples=config["stats"]["resamples"],
    script:
        "../scripts/table.py"
