"""Test double: the profiling endpoints and /metrics of vLLM, SGLang, TGI and llama.cpp, as httpx transports.

None of these servers runs on this CPU host. Each double answers as the engine's source does:
- vLLM: POST /start_profile, /stop_profile with no body -> 200 (404 when the profiler is off);
- SGLang: POST /start_profile with a ProfileReqInput JSON body -> "Start profiling.\n"; unknown body keys -> 422
  (FastAPI/pydantic); POST /stop_profile -> "Stop profiling. This will take some time.\n";
- GET /metrics: Prometheus text exposition with each engine's metric names, label sets and bucket bounds; every
  scrape after `observe()` reflects the observations (histograms cumulative, as prometheus_client keeps them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx

SGLANG_PROFILE_FIELDS = {"output_dir", "start_step", "num_steps", "activities", "with_stack", "record_shapes",
                         "profile_by_stage", "merge_profiles", "profile_prefix", "profile_stages"}
VLLM_ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
SGLANG_ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
                      0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000]
TGI_BUCKETS = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]


@dataclass
class Hist:
    buckets: list[float]
    obs: list[float] = field(default_factory=list)

    def lines(self, name: str, labels: str) -> list[str]:
        sep = "," if labels else ""
        out = [f"# HELP {name} x", f"# TYPE {name} histogram"]
        for b in self.buckets:
            out.append(f'{name}_bucket{{{labels}{sep}le="{b}"}} {float(sum(o <= b for o in self.obs))}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {float(len(self.obs))}')
        out.append(f"{name}_count{{{labels}}} {float(len(self.obs))}" if labels else f"{name}_count {float(len(self.obs))}")
        out.append(f"{name}_sum{{{labels}}} {sum(self.obs)}" if labels else f"{name}_sum {sum(self.obs)}")
        return out


class EngineDouble:
    """One engine's HTTP surface. `requests` records (method, path, body) for protocol assertions."""

    def __init__(self, engine: str, profiler_on: bool = True, metrics: bool = True) -> None:
        self.engine, self.profiler_on, self.metrics = engine, profiler_on, metrics
        self.requests: list[tuple[str, str, object]] = []
        self.hists: dict[str, Hist] = {}
        self.counters: dict[str, float] = {}
        if engine == "vllm":
            self.hists = {"vllm:inter_token_latency_seconds": Hist(VLLM_ITL_BUCKETS),
                          "vllm:request_time_per_output_token_seconds": Hist(VLLM_ITL_BUCKETS),
                          "vllm:time_to_first_token_seconds": Hist(VLLM_ITL_BUCKETS),
                          "vllm:e2e_request_latency_seconds": Hist(VLLM_ITL_BUCKETS)}
            self.counters = {"vllm:generation_tokens_total": 0.0}
        elif engine == "sglang":
            self.hists = {"sglang:inter_token_latency_seconds": Hist(SGLANG_ITL_BUCKETS),
                          "sglang:time_to_first_token_seconds": Hist(SGLANG_ITL_BUCKETS),
                          "sglang:e2e_request_latency_seconds": Hist(SGLANG_ITL_BUCKETS)}
            self.counters = {"sglang:generation_tokens_total": 0.0}
        elif engine == "tgi":
            self.hists = {"tgi_request_mean_time_per_token_duration": Hist(TGI_BUCKETS),
                          "tgi_request_duration": Hist(TGI_BUCKETS)}
        elif engine == "llama.cpp":
            self.counters = {"llamacpp:prompt_tokens_total": 0.0, "llamacpp:prompt_seconds_total": 0.0,
                             "llamacpp:tokens_predicted_total": 0.0, "llamacpp:tokens_predicted_seconds_total": 0.0,
                             "llamacpp:n_decode_total": 0.0}

    def observe(self, itl_s: list[float]) -> None:
        """One request of len(itl_s) + 1 tokens with these inter-token gaps."""
        n = len(itl_s)
        tpot = sum(itl_s) / n
        for name, h in self.hists.items():
            if "inter_token" in name:
                h.obs.extend(itl_s)
            elif "per_token" in name or "per_output" in name:
                h.obs.append(tpot)
            else:
                h.obs.append(sum(itl_s) + 0.05)
        for name in self.counters:
            if "generation_tokens" in name:
                self.counters[name] += n + 1
            elif name == "llamacpp:tokens_predicted_total":  # tokens timed by t_token_generation
                self.counters[name] += n
            elif name == "llamacpp:tokens_predicted_seconds_total":
                self.counters[name] += sum(itl_s)
            elif name == "llamacpp:n_decode_total":
                self.counters[name] += n

    def metrics_text(self) -> str:
        labels = {"vllm": 'engine="0",model_name="m"', "sglang": 'model_name="m"', "tgi": "",
                  "llama.cpp": ""}[self.engine]
        lines: list[str] = []
        for name, h in self.hists.items():
            lines += h.lines(name, labels)
        for name, v in self.counters.items():
            base = name[: -len("_total")] if name.endswith("_total") else name
            lines += [f"# HELP {base} x", f"# TYPE {base} counter",
                      f"{name}{{{labels}}} {v}" if labels else f"{name} {v}"]
        return "\n".join(lines) + "\n"

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.path, body))
        path = request.url.path
        if path == "/metrics":
            if not self.metrics:
                return httpx.Response(404, text="Not Found")
            return httpx.Response(200, text=self.metrics_text(),
                                  headers={"content-type": "text/plain; version=0.0.4; charset=utf-8"})
        if path in ("/start_profile", "/stop_profile") and request.method in ("POST", "GET"):
            if self.engine == "vllm":
                return httpx.Response(200 if self.profiler_on else 404, text="" if self.profiler_on else "Not Found")
            if self.engine == "sglang":
                if path == "/stop_profile":
                    return httpx.Response(200, text="Stop profiling. This will take some time.\n")
                extra = set(body or {}) - SGLANG_PROFILE_FIELDS
                if extra:
                    return httpx.Response(422, json={"detail": f"extra fields {sorted(extra)}"})
                return httpx.Response(200, text="Start profiling.\n")
        return httpx.Response(404, text="Not Found")

    def client(self) -> httpx.Client:
        return httpx.Client(transport=httpx.MockTransport(self.handler), base_url="http://127.0.0.1:30000")
