"""Config validation: the shipped config is valid; every error is one line naming the file (or --config) and field."""

from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from decode_gap.config import one_line_validation_error, resolve_run
from decode_gap.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
SCHEMA = str(REPO / "workflow" / "schemas" / "config.schema.json")


def shipped():
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def test_shipped_config_is_valid():
    cfg = shipped()
    validate(cfg, SCHEMA)
    run = resolve_run(cfg, REPO)
    assert run.model.architecture == "Gemma3ForCausalLM"


@pytest.mark.parametrize(
    "override, expected",
    [
        ({"tp": "two"}, "field 'tp': 'two' is not of type 'integer'"),
        ({"weight_format": "int3"}, "field 'weight_format': 'int3' is not one of"),
        ({"live": {"api": "grpc"}}, "field 'live.api': 'grpc' is not one of"),
        ({"bogus": 1}, "--config: field 'bogus': unknown field (not in workflow/schemas/config.schema.json)"),
        ({"live": {"endpoint": "http://x:1/v1"}}, "--config: field 'live.endpoint': unknown field"),
        ({"endpoint": "not-a-url"}, "field 'endpoint': 'not-a-url': expected OpenAI-compatible base URL"),
    ],
)
def test_schema_errors_are_one_line(override, expected, tmp_path):
    cfg = shipped()
    for k, v in override.items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v
    with pytest.raises(Exception) as info:
        validate(cfg, SCHEMA)
    line = one_line_validation_error(info.value, ["config/config.yaml"], override)
    assert "\n" not in line
    assert line.startswith("decode-gap: error: ")
    assert expected in line


def test_error_names_the_config_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tp: 0\n")
    cfg = {**shipped(), "tp": 0}
    with pytest.raises(Exception) as info:
        validate(cfg, SCHEMA)
    line = one_line_validation_error(info.value, ["config/config.yaml", str(bad)], {})
    assert line == f"decode-gap: error: {bad}: field 'tp': 0 is less than the minimum of 1"


def test_an_unknown_key_in_a_file_is_named_with_that_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("live:\n  concurrency_levels: [1]\n")
    cfg = shipped()
    cfg["live"] = {**cfg["live"], "concurrency_levels": [1]}
    with pytest.raises(Exception) as info:
        validate(cfg, SCHEMA)
    line = one_line_validation_error(info.value, ["config/config.yaml", str(bad)], {})
    assert line == (f"decode-gap: error: {bad}: field 'live.concurrency_levels': unknown field (not in "
                    "workflow/schemas/config.schema.json)")


@pytest.mark.parametrize("endpoint", ["", "http://127.0.0.1:8000/v1", "https://gpu-a01.example:443/v1",
                                      "http://[::1]:30000"])
def test_an_endpoint_is_a_base_url_or_empty(endpoint):
    validate({**shipped(), "endpoint": endpoint}, SCHEMA)


def test_unknown_hardware_and_model(tmp_path):
    with pytest.raises(ConfigError, match="config field 'hardware': no spec named 'tpu'"):
        resolve_run({**shipped(), "hardware": "tpu"}, REPO)
    with pytest.raises(ConfigError, match="model config.json not found"):
        resolve_run({**shipped(), "model": str(tmp_path / "x.json")}, REPO)


def test_defaults_come_from_the_schema_only():
    """One place for a default: the settings classes read theirs from the schema Snakemake validates against."""
    import dataclasses

    from decode_gap.config import schema_defaults, with_defaults
    from decode_gap.microbench.common import DEFAULTS, microbench_settings
    from decode_gap.settings import LiveSettings
    from decode_gap.simulate.engine_common import EngineSettings

    live = schema_defaults("live")
    s = LiveSettings()
    for name in ("api", "concurrency", "num_requests", "warmup_requests", "max_tokens", "input_len", "timeout_s",
                 "engine", "tokenizer", "server_metrics", "require_done", "ignore_eos"):
        assert getattr(s, name) == live[name], name
    assert (s.threads, s.ready_timeout_s) == (live["embedded"]["threads"], live["embedded"]["ready_timeout_s"])
    assert LiveSettings.from_params({}) == dataclasses.replace(s, server_profile=live["server_profile"])
    sim = schema_defaults("simulate")
    e = EngineSettings()
    assert (e.input_len, e.max_tokens, e.repeats, e.memory_fraction, e.compile) == (
        live["input_len"], live["max_tokens"], sim["engine_repeats"], sim["memory_fraction"], sim["engine_compile"])
    assert DEFAULTS == schema_defaults("microbench")
    merged = microbench_settings({"microbench": {"iters": 7, "allreduce": {"max_bytes": 64}}})
    assert merged["iters"] == 7 and merged["allreduce"]["max_bytes"] == 64
    assert merged["allreduce"]["min_bytes"] == DEFAULTS["allreduce"]["min_bytes"]
    assert with_defaults("live", {"embedded": {"threads": 3}})["embedded"] == {**live["embedded"], "threads": 3}


def test_snakemake_fills_the_same_defaults(tmp_path):
    """snakemake.utils.validate (set_default) and the core's with_defaults agree on every section."""
    from snakemake.utils import validate

    from decode_gap.config import with_defaults

    cfg: dict = {"live": {}, "simulate": {}, "microbench": {"allreduce": {}, "attention": {}}}
    cfg.update(yaml.safe_load((REPO / "config" / "config.yaml").read_text()) or {})
    for section in ("live", "simulate", "microbench"):
        cfg[section] = {}
    validate(cfg, SCHEMA)
    for section in ("live", "simulate", "microbench"):
        ours = with_defaults(section, {})
        assert {k: v for k, v in cfg[section].items() if k in ours} == ours, section


def test_nested_command_line_values_are_typed_as_the_schema_says():
    """`--config stages={live: false}` reaches the Snakefile as {'live': 'false'} (Snakemake parses a nested value
    with YAML's base loader): it is typed before validation, as the same value in config.yaml would be."""
    from snakemake.cli import parse_config

    from decode_gap.config import typed_cli_values

    given = parse_config(["stages={live: false, audit: True}", "microbench={warmup: 2, m_values: [1, 4]}",
                          "endpoint=http://a:1/v1", "tp=2", "live={concurrency: [1, 2], api: chat}"])
    assert given["stages"] == {"live": "false", "audit": "True"}  # what Snakemake hands over
    typed = typed_cli_values(given)
    assert typed["stages"] == {"live": False, "audit": True}
    assert typed["microbench"] == {"warmup": 2, "m_values": [1, 4]}
    assert typed["endpoint"] == "http://a:1/v1" and typed["tp"] == 2 and typed["live"]["api"] == "chat"
    # a value that does not parse is left for the schema to name
    assert typed_cli_values({"stages": {"live": "nope"}}) == {"stages": {"live": "nope"}}


def test_a_nested_boolean_on_the_command_line_passes_validation():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "roofline", "--config",
                           "stages={live: false}", "microbench={warmup: 2}", "hardware_revision=typed-cli-check"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-600:]
    assert "is not of type" not in proc.stderr
