# REPORT.md: every generated table and figure, with the published numbers beside ours.


rule report:
    input:
        report_inputs(),
    output:
        report(
            f"{REPORTS}/REPORT.md",
            category="Report",
            caption="../report/report.rst",
            labels={"file": "REPORT.md"},
        ),
    log:
        f"{LOGS}/reports/{STUDY_HASH}/report.log",
    benchmark:
        f"{BENCHMARKS}/reports/{STUDY_HASH}/report.tsv"
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/report.py"
