# Figures: <reports>/figures/<name>.{png,pdf} through eval.figures (inputs: figure_inputs).


rule figure:
    input:
        figure_inputs,
    output:
        multiext(f"{REPORTS}/figures/{{figure}}", ".png", ".pdf"),
    log:
        f"{LOGS}/reports/figure_{{figure}}.log",
    script:
        "../scripts/figure.py"
