"""The dashboards' PromQL and the alert rules on a real Prometheus (Debian's prometheus 2.42 and promtool).

- Every Prometheus query of every dashboard panel, read from the JSON and expanded as Grafana expands it,
  runs through Prometheus's HTTP API against a live `callqa worker` that has just transcribed a sample
  call: each must answer without error or warning, and with data.
- The alert rules pass `promtool check rules` and their unit tests (dashboards/prometheus/alerts_test.yml),
  and those unit tests fail when a rule is broken.
- The Prometheus config of docker-compose.kafka.yml is valid and lets the memory alert's join match.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.bench.workers import WorkerProcess, worker_env
from pipeline.broker.local import free_port
from pipeline.broker.producer import ContractProducer
from pipeline.config import Settings
from pipeline.contracts import AudioFrame, Serde
from pipeline.ingest.replay import ReplayOptions, TelephonyReplay, load_recording

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"
RULES = DASHBOARDS / "prometheus"
SAMPLE_CALL = REPO / "samples" / "calls" / "call_01.wav"
WORKER_JOB = "callqa-worker"  # the job name alerts.yml and the memory panel select
SCRAPE_S = 1.0
# The panels are looked at as "Last 5 minutes"; Grafana sends a panel's width in pixels as maxDataPoints.
VIEW_S = 300.0
MAX_DATA_POINTS = 1000
SAFE_RESOLUTION = 11_000  # Grafana's cap on points per series (pkg/promlib: safeResolution)
# Grafana's interval rounding (gtime.roundInterval): (interval up to, rounded to), in seconds.
ROUNDING = ((0.01, 0.001), (0.015, 0.01), (0.035, 0.02), (0.075, 0.05), (0.15, 0.1), (0.35, 0.2), (0.75, 0.5),
            (1.5, 1), (3.5, 2), (7.5, 5), (12.5, 10), (17.5, 15), (25, 20), (45, 30), (90, 60), (210, 120),
            (450, 300), (750, 600), (1050, 900), (1500, 1200), (2700, 1800), (5400, 3600), (9000, 7200),
            (16200, 10800), (32400, 21600), (86400, 43200), (604800, 86400), (1814400, 604800),
            (3628800, 2592000))  # fmt: skip


# ---- Grafana's expansion of a Prometheus query (pkg/promlib/models/query.go) ---------------------------
def round_interval(seconds: float) -> float:
    return next((rounded for upper, rounded in ROUNDING if seconds <= upper), 31_536_000.0)


def go_duration(seconds: float) -> str:
    """A duration as Go's time.Duration.String() writes it (what Grafana puts in for $__rate_interval)."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    hours, rest = divmod(round(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if hours or minutes else "") + f"{secs}s"


def grafana_format_interval(seconds: float) -> str:
    """gtime.FormatInterval: the largest whole unit (what Grafana puts in for $__interval)."""
    for unit, size in (("y", 31_536_000), ("w", 604_800), ("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{round(seconds * 1000)}ms"


@dataclass(frozen=True)
class GrafanaQuery:
    expr: str
    start: float
    end: float
    step: float


def grafana_query(expr: str, variables: dict[str, str], now: float, range_s: float, scrape_s: float,
                  max_data_points: int = MAX_DATA_POINTS) -> GrafanaQuery:
    """What Grafana's Prometheus data source sends for a range query of ``expr`` over the last ``range_s``
    seconds, the data source's scrape interval (its `timeInterval`) being ``scrape_s``."""
    calculated = range_s / max_data_points
    step = scrape_s if calculated < scrape_s else round_interval(calculated)
    step = max(step, round_interval(range_s / SAFE_RESOLUTION))
    rate_interval = max(step + scrape_s, 4 * scrape_s)
    builtins = {
        "__rate_interval_ms": str(round(rate_interval * 1000)), "__rate_interval": go_duration(rate_interval),
        "__interval_ms": str(round(step * 1000)), "__interval": grafana_format_interval(step),
        "__range_ms": str(round(range_s * 1000)), "__range_s": str(round(range_s)), "__range": f"{round(range_s)}s",
    }  # fmt: skip
    for name, value in [*builtins.items(), *sorted(variables.items(), key=lambda kv: -len(kv[0]))]:
        expr = expr.replace(f"${{{name}}}", value).replace(f"[[{name}]]", value)
        expr = re.sub(rf"\${re.escape(name)}\b", lambda _m, v=value: v, expr)
    assert not re.search(r"\$\{?\w|\[\[\w", expr), f"unexpanded Grafana variable in: {expr}"
    # Grafana aligns the range to the step (rounds start and end down to a multiple of it).
    return GrafanaQuery(expr, math.floor((now - range_s) / step) * step, math.floor(now / step) * step, step)


def template_values(dashboard: dict[str, Any]) -> dict[str, str]:
    """Each template variable at its current value; "All" as the variable's allValue (else a match-all regex)."""
    chosen = {}
    for variable in dashboard.get("templating", {}).get("list", []):
        current = variable.get("current", {}).get("value", "")
        if current in ("$__all", ["$__all"]):
            current = variable.get("allValue") or ".*"
        chosen[variable["name"]] = current if isinstance(current, str) else "|".join(current)
    return chosen


def prometheus_targets() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(dashboard file: panel title, target, the dashboard) of every Prometheus query, rows included."""
    found = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        panels = [p for top in dashboard["panels"] for p in [top, *top.get("panels", [])]]
        for panel in panels:
            for target in panel.get("targets", []):
                source = target.get("datasource") or panel.get("datasource") or {}
                if source.get("type") == "prometheus":
                    found.append((f"{path.name}: {panel['title']} ({target['refId']})", target, dashboard))
    return found


def test_grafana_intervals_match_grafanas_own_arithmetic() -> None:
    # Last 24 h on a 1000 px panel, 15 s scrapes: 86.4 s rounds to 1m; rate interval max(1m + 15s, 4 * 15s).
    q = grafana_query("rate(x[$__rate_interval]) / $__interval / $__range", {}, 1_000_000.0, 86_400, 15)
    assert (q.step, q.expr) == (60, "rate(x[1m15s]) / 1m / 86400s")
    assert (q.start % 60, q.end) == (0, 999_960)
    # Last 5 min, 1 s scrapes: 0.3 s is below the scrape interval, which wins; 4 scrapes for the rate.
    q = grafana_query("increase(x[$__rate_interval])", {}, 1_000_000.5, VIEW_S, 1)
    assert (q.step, q.expr, q.end) == (1, "increase(x[4s])", 1_000_000)
    q = grafana_query('x{worker=~"$worker"}', {"worker": ".*"}, 0.0, 60, 1)
    assert q.expr == 'x{worker=~".*"}'
    with pytest.raises(AssertionError, match="unexpanded"):
        grafana_query("x[$__unknown]", {}, 0.0, 60, 1)


# ---- a real Prometheus ----------------------------------------------------------------------------------
def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: Debian's `prometheus` package provides it (`make system` installs it)")
    return path


class PrometheusError(RuntimeError):
    pass


@dataclass
class PrometheusServer:
    """A Prometheus server on a free loopback port with its storage in ``folder``; stop() ends it by PID."""

    folder: Path
    scrape_targets: list[str]
    rule_files: list[Path]
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> None:
        self.port = free_port()
        config = {
            "global": {"scrape_interval": f"{SCRAPE_S:g}s", "evaluation_interval": f"{SCRAPE_S:g}s"},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [{"job_name": WORKER_JOB, "static_configs": [{"targets": self.scrape_targets}]}],
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        log = open(self.folder / "prometheus.log", "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [binary("prometheus"), f"--config.file={self.folder / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.folder / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PrometheusError(f"prometheus exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2):  # noqa: S310 - loopback
                    return
            except OSError:
                time.sleep(0.2)
        raise PrometheusError(f"prometheus not ready in {timeout_s:.0f} s: {self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def log_tail(self, n: int = 20) -> str:
        path = self.folder / "prometheus.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""

    def api(self, path: str, **form: str) -> dict[str, Any]:
        """A Prometheus API call (POST, as Grafana sends queries); the whole JSON answer, errors included."""
        data = urllib.parse.urlencode(form).encode() if form else None
        try:
            with urllib.request.urlopen(f"{self.url}{path}", data=data, timeout=30) as resp:  # noqa: S310
                body: dict[str, Any] = json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # 400/422: the JSON body says what is wrong with the query
            body = json.loads(exc.read())
        return body

    def instant(self, expr: str) -> list[dict[str, Any]]:
        body = self.api("/api/v1/query", query=expr)
        if body.get("status") != "success":
            raise PrometheusError(f"{expr}: {body.get('errorType')}: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_for(self, expr: str, what: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Poll an instant query until it returns something (a condition written in PromQL)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.instant(expr)
            if result:
                return result
            time.sleep(SCRAPE_S / 2)
        raise TimeoutError(f"Prometheus never had {what} ({expr}) in {timeout_s:.0f} s: {self.log_tail()}")


# ---- the live run -------------------------------------------------------------------------------------
@dataclass
class LiveRun:
    prometheus: PrometheusServer
    worker: WorkerProcess
    settings: Settings


def send_bad_input(settings: Settings, call_id: str) -> None:
    """One undecodable message (a dead letter) and one frame of a call that has ended (a dropped frame)."""
    producer = ContractProducer(settings.bootstrap, Serde.from_settings())
    producer.send_raw(settings.topic_audio, call_id.encode(), b"\x00\x00\x00\x00\x01not avro")
    producer.send(settings.topic_audio, call_id, AudioFrame(call_id, "agent", 0, 0, 8000, "mulaw", b"\xff" * 160))
    producer.flush()


def wait_for_worker_metric(worker: WorkerProcess, name: str, timeout_s: float = 60.0, **labels: str) -> None:
    deadline = time.monotonic() + timeout_s
    while worker.metric(name, **labels) < 1:
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker never counted {name}{labels}: {worker.log_tail()}")
        time.sleep(0.3)


@pytest.fixture
def live(kafka_settings: Settings, tmp_path: Path) -> Iterator[LiveRun]:
    """A worker that has transcribed one sample call (replayed as fast as possible), then got one
    undecodable message and one frame after its call's end, all scraped every second by Prometheus
    (which also evaluates alerts.yml)."""
    port = free_port()
    s = kafka_settings
    worker = WorkerProcess(worker_env({
        "bootstrap_servers": s.bootstrap, "topic_audio": s.topic_audio, "topic_call_events": s.topic_call_events,
        "topic_transcripts": s.topic_transcripts, "topic_latency": s.topic_latency, "topic_qa": s.topic_qa,
        "topic_dead_letters": s.topic_dead_letters, "worker_id": s.worker_id, "web_port": str(port),
        "clickhouse_url": f"chdb://{(tmp_path / 'chdb').resolve()}", "commit_interval_s": "1.0",
        "model_watch_interval_s": "0",
    }), port, tmp_path / "worker.log")  # fmt: skip
    prometheus = PrometheusServer(tmp_path / "prometheus", [f"127.0.0.1:{port}"], [RULES / "alerts.yml"])
    try:
        worker.start()
        prometheus.start()
        # Counters must be scraped at their starting value, or rate() cannot see their first increase.
        prometheus.wait_for(f'up{{job="{WORKER_JOB}"}} == 1', "a successful scrape of the worker")
        recording = load_recording(SAMPLE_CALL, ReplayOptions(encoding="mulaw"))
        player = TelephonyReplay(ContractProducer(s.bootstrap, Serde.from_settings()), s.topic_audio,
                                 s.topic_call_events)
        call_ids = player.run([recording], ReplayOptions(encoding="mulaw", realtime=False)).call_ids
        worker.wait_for_calls(call_ids)
        send_bad_input(s, call_ids[0])
        wait_for_worker_metric(worker, "callqa_dead_letters_total")
        wait_for_worker_metric(worker, "callqa_frames_dropped_total", reason="after_call_end")
        # Two more scrapes after the last increase, so a rate window holds samples before and after it.
        after = time.time() + 2 * SCRAPE_S
        prometheus.wait_for(f'timestamp(up{{job="{WORKER_JOB}"}}) > {after}', "scrapes after the load")
        yield LiveRun(prometheus, worker, s)
    finally:
        prometheus.stop()
        worker.stop()


def values(result: list[dict[str, Any]]) -> list[float]:
    return [float(v) for series in result for _, v in series["values"]]


@pytest.mark.broker
@pytest.mark.slow
def test_every_dashboard_promql_query_and_alert_rule_runs_on_a_live_worker(live: LiveRun) -> None:
    targets = prometheus_targets()
    assert len(targets) >= 8, [t for t, _, _ in targets]  # the extraction found the panels' queries
    now = time.time()
    answers: dict[str, list[dict[str, Any]]] = {}
    for where, target, dashboard in targets:
        q = grafana_query(target["expr"], template_values(dashboard), now, VIEW_S, SCRAPE_S)
        body = live.prometheus.api("/api/v1/query_range", query=q.expr, start=f"{q.start:.3f}",
                                   end=f"{q.end:.3f}", step=f"{q.step:g}")
        assert body.get("status") == "success", f"{where}: {q.expr}: {body.get('error')}"
        assert not body.get("warnings") and not body.get("infos"), f"{where}: {body}"
        result = body["data"]["result"]
        assert body["data"]["resultType"] == "matrix" and result, f"{where}: no series for {q.expr}"
        assert any(math.isfinite(v) for v in values(result)), f"{where}: only NaN/Inf for {q.expr}"
        answers[where] = result

    def panel(title: str) -> list[dict[str, Any]]:
        return next(r for where, r in answers.items() if f": {title} (" in where)

    # What the panels show follows what the worker went through.
    assert max(values(panel("Dead letters"))) > 0  # the undecodable message
    assert max(values(panel("Dropped frames"))) > 0  # the frame after its call's end
    topics = {series["metric"].get("topic") for series in panel("Consumer lag")}
    assert {live.settings.topic_audio, live.settings.topic_call_events} <= topics
    assert min(values(panel("Worker memory"))) > 10e6

    # The alert rules, evaluated every second meanwhile, ran against the worker's real series.
    body = live.prometheus.api("/api/v1/rules")
    rules = {r["name"]: r for g in body["data"]["groups"] for r in g["rules"]}
    assert set(rules) == {"CallqaFinalDelayP99High", "CallqaMemoryHighAndRising", "CallqaPostCallBacklogGrowing"}
    for name, rule in rules.items():
        assert (rule["health"], rule.get("lastError", "")) == ("ok", ""), f"{name}: {rule}"


# ---- promtool -----------------------------------------------------------------------------------------
def promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary("promtool"), *map(str, args)], capture_output=True, text=True, timeout=120,
                          cwd=cwd, check=False)


def test_alert_rules_pass_promtool_check_and_their_unit_tests() -> None:
    check = promtool("check", "rules", RULES / "alerts.yml")
    assert check.returncode == 0 and "SUCCESS: 3 rules found" in check.stdout, check.stdout + check.stderr
    unit = promtool("test", "rules", RULES / "alerts_test.yml")
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr


def test_every_alert_has_a_firing_case_with_its_labels_and_annotations() -> None:
    rules = [r for g in yaml.safe_load((RULES / "alerts.yml").read_text())["groups"] for r in g["rules"]]
    cases = [case for test in yaml.safe_load((RULES / "alerts_test.yml").read_text())["tests"]
             for case in test.get("alert_rule_test", [])]  # fmt: skip
    for rule in rules:
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        firing = [a for c in mine for a in c["exp_alerts"]]
        assert firing and all(set(rule["annotations"]) <= set(a["exp_annotations"]) for a in firing), rule["alert"]
        assert all(rule["labels"].items() <= a["exp_labels"].items() for a in firing), rule["alert"]
        assert sum(1 for c in mine if not c["exp_alerts"]) >= 3, f"{rule['alert']}: too few quiet cases"


# Each breaks one thing the rules promise; the unit tests must notice every one.
MUTATIONS = {
    "no for: fires at once": ("for: 1m", "for: 0s"),
    "delay threshold 500 ms": ("> 0.2\n", "> 0.5\n"),
    "delay threshold 190 ms": ("> 0.2\n", "> 0.19\n"),
    "delay per worker, not summed": ("sum by (le)", "sum by (le, instance)"),
    "memory threshold 90 %": ("> 0.8\n", "> 0.9\n"),
    "memory not required to rise": ("[5m]) > 0", "[5m]) >= 0"),
    "no severity label": ("severity: page", "severity: ticket"),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_alert_unit_tests_fail_when_a_rule_is_broken(mutation: str, tmp_path: Path) -> None:
    old, new = MUTATIONS[mutation]
    rules = (RULES / "alerts.yml").read_text()
    assert old in rules, f"mutation {mutation!r} no longer applies to alerts.yml"
    (tmp_path / "alerts.yml").write_text(rules.replace(old, new))
    shutil.copy(RULES / "alerts_test.yml", tmp_path / "alerts_test.yml")
    assert promtool("check", "rules", tmp_path / "alerts.yml").returncode == 0  # still a valid rule file
    unit = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert unit.returncode != 0 and "FAILED" in unit.stdout + unit.stderr, unit.stdout


# ---- docker-compose's Prometheus --------------------------------------------------------------------------
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.kafka.yml").read_text())
    return document


def test_compose_prometheus_config_is_valid_and_joins_worker_and_node_on_instance(tmp_path: Path) -> None:
    config = yaml.safe_load(compose()["configs"]["prometheus_config"]["content"])
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    config["rule_files"] = [str(RULES / "alerts.yml")]  # where the container mounts it
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    check = promtool("check", "config", tmp_path / "prometheus.yml")
    assert check.returncode == 0, check.stdout + check.stderr
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}

    def instances(job: str) -> set[str]:
        # Prometheus sets `instance` to the target's address unless the target's labels or a relabel rule
        # name it; the worker job finds its replicas by DNS and names the host by relabelling.
        named = {c.get("labels", {}).get("instance", t) for c in jobs[job].get("static_configs", [])
                 for t in c["targets"]}
        relabelled = {r["replacement"] for r in jobs[job].get("relabel_configs", []) if r.get("target_label") == "instance"}
        return named | relabelled

    assert instances(WORKER_JOB) and instances(WORKER_JOB) == instances("node")  # the memory alert's `on (instance)`
    # Replicas (--scale worker=N) share `instance`: their address keeps their series apart.
    assert {"source_labels": ["__address__"], "target_label": "replica"} in jobs[WORKER_JOB]["relabel_configs"]


def test_compose_worker_serves_metrics_beyond_its_container_and_publishes_on_loopback() -> None:
    worker = compose()["services"]["worker"]
    assert worker["environment"]["CALLQA_WEB_HOST"] == "0.0.0.0"  # noqa: S104 - inside its container
    port = int(worker["environment"]["CALLQA_WEB_PORT"])
    # --scale worker=N: no fixed name or host port, each replica published on the host's loopback only.
    assert "container_name" not in worker
    assert worker["ports"] == [{"target": port, "host_ip": "127.0.0.1"}]
    scraped = yaml.safe_load(compose()["configs"]["prometheus_config"]["content"])["scrape_configs"]
    job = next(j for j in scraped if j["job_name"] == WORKER_JOB)
    assert job["dns_sd_configs"][0]["names"] == ["worker"] and job["dns_sd_configs"][0]["port"] == port


def test_compose_gateway_takes_its_secrets_from_the_environment_and_drains_on_stop() -> None:
    import re

    from pipeline.config import Settings

    gateway = compose()["services"]["gateway"]
    env = gateway["environment"]
    for secret in ("CALLQA_TWILIO_AUTH_TOKEN", "CALLQA_AUDIOHOOK_API_KEY", "CALLQA_AUDIOHOOK_CLIENT_SECRET"):
        assert env[secret] == f"${{{secret}:?set {secret}}}"  # required, never a default
    assert set(env) <= {f"CALLQA_{name.upper()}" for name in Settings.model_fields}  # settings that exist
    command = re.search(r'CMD (\[.*\])', gateway["build"]["dockerfile_inline"])
    assert command is not None
    argv = yaml.safe_load(command.group(1))
    port = int(argv[argv.index("--port") + 1])
    assert argv[:2] == ["callqa", "gateway"] and argv[argv.index("--host") + 1] == "0.0.0.0"  # noqa: S104
    assert gateway["ports"] == [f"{port}:{port}"] and f"127.0.0.1:{port}/healthz" in " ".join(gateway["healthcheck"]["test"])
    assert gateway["depends_on"]["kafka"] == {"condition": "service_healthy"}
    grace_s = int(gateway["stop_grace_period"].rstrip("s"))
    assert grace_s > Settings.model_fields["gateway_drain_s"].default  # SIGTERM's drain ends before SIGKILL


def test_grafana_datasource_scrape_interval_is_prometheus_scrape_interval() -> None:
    # $__rate_interval is computed from the data source's timeInterval: it must be the real scrape interval.
    sources = yaml.safe_load((DASHBOARDS / "provisioning" / "datasources" / "clickhouse.yaml").read_text())
    prometheus = next(d for d in sources["datasources"] if d["type"] == "prometheus")
    config = yaml.safe_load(compose()["configs"]["prometheus_config"]["content"])
    assert prometheus["jsonData"]["timeInterval"] == config["global"]["scrape_interval"]
