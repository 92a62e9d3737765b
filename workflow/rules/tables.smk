# Tables: generated from run summaries / evaluation outputs / benchmark records, never edited by hand.
# One rule for every table of analysis/tables/registry.py whose inputs the workflow lists (TABLE_INPUTS, by the
# record's input kind); each writes <reports>/<name>.{md,csv,tex} through analysis.tables. The CPT table is
# built by workflow/rules/cpt.smk (its manifest and batch check). The downstream table reads the per-question
# samples itself (there is no separate paired-stats step): its verdicts need the whole family (Holm across
# rows) and, with several seeds, every seed at once (seed-level test).

TABLE_INPUTS = {  # a record's input kind -> the files of this config
    "table1_runs": table1_summaries,
    "heads_runs": heads_summaries,
    "downstream_evals": lambda: downstream_results() + RELEASED_RESULTS,
    "released_evals": lambda: RELEASED_RESULTS,
    "bench": bench_csvs,
}
TABLE_OPTIONS = (
    {  # table-specific options of a builder (analysis.tables.registry.Build.options)
        "released": {
            "arms": {
                label: {"published": arm["published"]}
                for label, arm in RELEASED.items()
            }
        },
    }
)
BUILT_HERE = [name for name, spec in TABLES.items() if spec.inputs in TABLE_INPUTS]


rule table:
    input:
        lambda w: TABLE_INPUTS[TABLES[w.table].inputs](),
    output:
        table_report("{table}"),
    log:
        f"{LOGS}/reports/{STUDY_HASH}/{{table}}.log",
    benchmark:
        f"{BENCHMARKS}/reports/{STUDY_HASH}/{{table}}.tsv"
    wildcard_constraints:
        table="|".join(BUILT_HERE),
    conda:
        "../envs/analysis.yaml"
    params:
        inputs=lambda w: TABLES[w.table].inputs,
        about=lambda w: TABLES[w.table].about,
        resamples=config["stats"]["resamples"],
        published=config.get("published", {}),
        options=lambda w: TABLE_OPTIONS.get(w.table, {}),
    script:
        "../scripts/table.py"
