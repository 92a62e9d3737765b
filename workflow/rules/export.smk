# Hugging Face export of every trained run of the config (target `export_hf`): one job per run, from its
# model.pt to results/hf/<label>/<size>/seed<k>/<rid>/ (mhar.hf.export_hf: safetensors, config,
# tokenizer files, model card with the run's provenance; the baseline loads as stock Qwen3/Llama, the routed
# variants with trust_remote_code). The export reloads itself and compares logits before it is moved in place.

HF_EXPORT = RUN.replace(f"{RESULTS}/runs/", f"{RESULTS}/hf/", 1)


# One export per distinct run of Table 1, the head sweep and the downstream grid.
EXPORT_HF_TARGETS = [
    run.replace(f"{RESULTS}/runs/", f"{RESULTS}/hf/", 1)
    for run in dict.fromkeys(
        run_dir(v, s, k)
        for v, s, k in grid(T1_LABELS, config["sizes"], config["seeds"])
        + grid(
            config["heads"]["variants"],
            config["heads"]["sizes"],
            config["heads"]["seeds"],
        )
        + grid(DS["variants"], DS["sizes"], DS["seeds"])
    )
]


rule export_hf_run:
    input:
        model=f"{RUN}/model.pt",
        summary=f"{RUN}/summary.json",
    output:
        directory(HF_EXPORT),
    log:
        f"{LOGS}/export_hf/{{variant}}/{{size}}/seed{{seed}}/{{rid}}.log",
    benchmark:
        f"{BENCHMARKS}/export_hf/{{variant}}/{{size}}/seed{{seed}}/{{rid}}.tsv"
    conda:
        "../envs/eval.yaml"
    threads: RES["threads_per_run"]
    resources:
        mem_mb=RES["mem_mb"],
    script:
        "../scripts/export_hf.py"


rule export_hf:
    input:
        EXPORT_HF_TARGETS,
    localrule: True
    conda:
        "../envs/eval.yaml"
