# REPORT.md: every generated table and figure, with the published numbers beside ours.


rule report:
    input:
        report_inputs(),
    output:
        f"{REPORTS}/REPORT.md",
    log:
        f"{LOGS}/reports/report.log",
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/report.py"
