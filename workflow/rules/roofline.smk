# Roofline: bytes, FLOPs and floors per token per GPU; depends only on model, hardware and config.


rule compute_roofline:
    input:
        model=RUN.model.path,
        hardware=RUN.hardware.path or [],
        gguf=gguf_input,
    output:
        json=res("roofline.json"),
        components=res("roofline_components.csv"),
    log:
        res("logs/compute_roofline.log"),
    conda:
        "../../envs/decode-gap.yaml"
    params:
        run=run_params("roofline"),
    script:
        "../scripts/compute_roofline.py"


rule roofline:
    input:
        rules.compute_roofline.output,
