# Paired statistics: treatment vs baseline on the same documents (aligned by doc_id).


rule paired_stats:
    input:
        unpack(paired_samples),
    output:
        STATS,
    log:
        f"{LOGS}/stats/{{hash}}/{{ehash}}/{{size}}/seed{{seed}}/{{task}}/{{variant}}_vs_{{baseline}}.log",
    conda:
        "../envs/analysis.yaml"
    params:
        resamples=config["stats"]["resamples"],
    script:
        "../scripts/paired_stats.py"
