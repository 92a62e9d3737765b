# Figures: <reports>/figures/<name>.{png,pdf} through analysis.figures (inputs: figure_inputs).


rule figure:
    input:
        figure_inputs,
    output:
        report(
            multiext(f"{REPORTS}/figures/{{figure}}", ".png", ".pdf"),
            category="Figures",
            caption="../report/figure.rst",
            labels={"figure": "{figure}"},
        ),
    log:
        f"{LOGS}/reports/{STUDY_HASH}/figure_{{figure}}.log",
    benchmark:
        f"{BENCHMARKS}/reports/{STUDY_HASH}/figure_{{figure}}.tsv"
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/figure.py"


# Mechanism probe of a trained routed model (first seed): slice KL vs a matched-norm null,
# source cosine, per-site mean routing weights (the routing_heatmap figure reads these).
rule probe:
    input:
        probe_model,
    output:
        f"{REPORTS}/probe/{{size}}/{{variant}}.json",
    log:
        f"{LOGS}/reports/{STUDY_HASH}/probe_{{size}}_{{variant}}.log",
    benchmark:
        f"{BENCHMARKS}/reports/{STUDY_HASH}/probe_{{size}}_{{variant}}.tsv"
    conda:
        "../envs/eval.yaml"
    params:
        slices=4,
    script:
        "../scripts/probe.py"
