# Continued pretraining (PAPER.md "8B continued pretraining", Table 3): convert a Llama base
# exactly to the plain and the MHAR-delta form, train both arms on identical batches and
# schedule, evaluate base / plain / MHAR, and tabulate CPT gain vs MHAR gain.
# Config: the `cpt:` block (mhar.cpt.CPTConfig; config/cpt.yaml documents every key).
# Results: results/cpt/<hash of the cpt block>/{base,init,runs,eval}/ ; table: reports/cpt.*

# Config, paths and functions: workflow/rules/cpt_common.smk.


rule cpt_pretrain_base:
    output:
        summary=f"{CPT_ROOT}/base/run/summary.json",
        metrics=f"{CPT_ROOT}/base/run/metrics.jsonl",
        model=f"{CPT_ROOT}/base/run/model.pt",
    log:
        f"{CPT_LOGS}/pretrain_base.log",
    benchmark:
        f"{CPT_BENCHMARKS}/pretrain_base.tsv"
    conda:
        "../envs/train.yaml"
    threads: RES["threads_per_run"]
    resources:
        **gpu_resources(CPT.gpus),
        mem_mb=RES["mem_mb"],
        runtime=RES["runtime_min"],
    params:
        run_config=lambda w: base_run_config(CPT),
        gpus=CPT.gpus,
    script:
        "../scripts/train.py"


rule cpt_export_base:
    input:
        model=f"{CPT_ROOT}/base/run/model.pt",
    output:
        config=f"{CPT_ROOT}/base/hf/config.json",
    log:
        f"{CPT_LOGS}/export_base.log",
    benchmark:
        f"{CPT_BENCHMARKS}/export_base.tsv"
    conda:
        "../envs/train.yaml"
    script:
        "../scripts/cpt_export.py"


rule cpt_convert:
    input:
        cpt_base_source,
    output:
        model=f"{CPT_ROOT}/init/{{arm}}/model.pt",
        report=f"{CPT_ROOT}/init/{{arm}}/conversion.json",
    log:
        f"{CPT_LOGS}/convert_{{arm}}.log",
    benchmark:
        f"{CPT_BENCHMARKS}/convert_{{arm}}.tsv"
    conda:
        "../envs/train.yaml"
    threads: RES["threads_per_run"]
    resources:
        mem_mb=RES["mem_mb"],
    params:
        src=CPT.base.hf or f"{CPT_ROOT}/base/hf",
    script:
        "../scripts/cpt_convert.py"


rule cpt_train:
    input:
        init=f"{CPT_ROOT}/init/{{arm}}/model.pt",
        report=f"{CPT_ROOT}/init/{{arm}}/conversion.json",
    output:
        summary=f"{CPT_ROOT}/runs/{{arm}}/summary.json",
        metrics=f"{CPT_ROOT}/runs/{{arm}}/metrics.jsonl",
        model=f"{CPT_ROOT}/runs/{{arm}}/model.pt",
    log:
        f"{CPT_LOGS}/train_{{arm}}.log",
    benchmark:
        f"{CPT_BENCHMARKS}/train_{{arm}}.tsv"
    conda:
        "../envs/train.yaml"
    threads: RES["threads_per_run"]
    resources:
        **gpu_resources(CPT.gpus),
        mem_mb=RES["mem_mb"],
        runtime=RES["runtime_min"],
    params:
        gpus=CPT.gpus,
    script:
        "../scripts/cpt_train.py"


rule cpt_check_batches:
    input:
        plain=f"{CPT_ROOT}/runs/plain/metrics.jsonl",
        mhar=f"{CPT_ROOT}/runs/mhar/metrics.jsonl",
    output:
        f"{CPT_ROOT}/batch_check.json",
    log:
        f"{CPT_LOGS}/check_batches.log",
    benchmark:
        f"{CPT_BENCHMARKS}/check_batches.tsv"
    conda:
        "../envs/train.yaml"
    script:
        "../scripts/cpt_check.py"


rule cpt_evaluate:
    input:
        model=lambda w: f"{CPT_ROOT}/{CPT_EVAL_MODEL[w.cpt_model]}/model.pt",
    output:
        results=f"{CPT_ROOT}/eval/{{cpt_model}}/{{task}}/results.json",
        samples=f"{CPT_ROOT}/eval/{{cpt_model}}/{{task}}/samples.jsonl",
        lm_eval=directory(f"{CPT_ROOT}/eval/{{cpt_model}}/{{task}}/lm_eval"),
    log:
        f"{CPT_LOGS}/eval_{{cpt_model}}_{{task}}.log",
    benchmark:
        f"{CPT_BENCHMARKS}/eval_{{cpt_model}}_{{task}}.tsv"
    conda:
        "../envs/eval.yaml"
    threads: RES["threads_per_run"]
    resources:
        **gpu_resources(RES["eval_gpus"]),
        mem_mb=RES["mem_mb"],
        runtime=RES["eval_runtime_min"],
    script:
        "../scripts/cpt_evaluate.py"


rule cpt_table:
    input:
        results=expand(
            f"{CPT_ROOT}/eval/{{m}}/{{t}}/results.json",
            m=["base", "plain", "mhar"],
            t=CPT.eval.tasks,
        ),
        batch_check=f"{CPT_ROOT}/batch_check.json",
    output:
        table_report("cpt"),
    log:
        f"{LOGS}/reports/{STUDY_HASH}/cpt.log",
    benchmark:
        f"{BENCHMARKS}/reports/{STUDY_HASH}/cpt.tsv"
    conda:
        "../envs/analysis.yaml"
    params:
        scale=CPT.scale,
        about=TABLES["cpt"].about,
        resamples=config.get("stats", {}).get("resamples", 4999),
        published=config.get("published", {}),
    script:
        "../scripts/cpt_table.py"
