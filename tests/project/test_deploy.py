"""The compose deployment (``deploy/``) without running its containers: loopguard's own
``check-config`` accepts the config the compose file mounts (listening on all interfaces only
because that file says so), Prometheus scrapes the route the server serves its metrics on, and
every metric the Grafana dashboard queries is one loopguard exports."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import yaml
from prometheus_client.parser import text_string_to_metric_families

from proxy.config import Config, load_config
from proxy.core.actions import Remind
from proxy.edge.admin import metrics
from proxy.edge.app import create_app
from proxy.edge.metrics import Metrics
from proxy.edge.observe import Stats

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def mounted_config() -> tuple[Path, str]:
    """The loopguard service's config: the file on the host and the path ``--config`` names."""
    service = compose()["services"]["loopguard"]
    command = service["command"]
    target = command[command.index("--config") + 1]
    for volume in service["volumes"]:
        source, dest, *_ = volume.split(":")
        if dest == target:
            return (DEPLOY / source).resolve(), target
        if target.startswith(dest.rstrip("/") + "/"):  # the file's directory is mounted
            return (DEPLOY / source / target[len(dest.rstrip("/")) + 1 :]).resolve(), target
    raise AssertionError(f"nothing mounted at {target}")


def test_check_config_accepts_the_config_the_compose_file_mounts() -> None:
    path, target = mounted_config()
    assert path == DEPLOY / "config" / "loopguard.yaml"
    # the directory is mounted, not the file: an editor's save-by-rename would leave a file
    # bind mount on the old file, and SIGHUP would re-read that
    volumes = compose()["services"]["loopguard"]["volumes"]
    assert "./config:/etc/loopguard:ro" in volumes
    assert target == "/etc/loopguard/loopguard.yaml"
    run = subprocess.run(
        [sys.executable, "-m", "proxy", "check-config", str(path), "--print"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    effective = yaml.safe_load(run.stdout)
    assert effective["listen"] == {**effective["listen"], "host": "0.0.0.0", "port": 4000}
    assert effective["upstream"]["url"] == "http://llama:8080/v1"
    assert effective["guards"]["circuit_breaker"]["incident_log"].startswith("/var/lib/loopguard/")
    # the loopguard service publishes the port it listens on, on the host's loopback only
    assert compose()["services"]["loopguard"]["ports"] == ["127.0.0.1:4000:4000"]


def test_the_image_listens_on_all_interfaces_only_through_its_config_file() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    entry = re.search(r"^ENTRYPOINT (.+)$", dockerfile, re.M)
    cmd = re.search(r"^CMD (.+)$", dockerfile, re.M)
    assert entry is not None and cmd is not None
    assert orjson.loads(entry.group(1)) == ["loopguard", "serve"]  # no --host flag
    config = orjson.loads(cmd.group(1))
    _, target = mounted_config()
    assert config == ["--config", target]
    assert f"COPY deploy/config/loopguard.yaml {target}" in dockerfile
    assert Config().listen.host == "127.0.0.1"  # the default everywhere else


def test_the_llama_server_runs_with_its_chat_template_on_a_model_volume() -> None:
    llama = compose()["services"]["llama"]
    assert llama["image"] == "ghcr.io/ggml-org/llama.cpp:server"
    assert "--jinja" in llama["command"]
    assert "./models:/models:ro" in llama["volumes"]
    assert load_config(DEPLOY / "config" / "loopguard.yaml").upstream.url.startswith("http://llama:8080/")


def test_prometheus_scrapes_the_metrics_route() -> None:
    scrape = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())["scrape_configs"]
    (job,) = [j for j in scrape if j["job_name"] == "loopguard"]
    routes = [
        r.resource.canonical
        for r in create_app(Config()).router.routes()
        if r.handler is metrics and r.method == "GET" and r.resource is not None
    ]
    assert routes == [job["metrics_path"]] == ["/loop-guard/metrics"]
    assert job["static_configs"] == [{"targets": ["loopguard:4000"]}]


def exported_samples() -> set[str]:
    """Every sample name loopguard's metrics render, with each labelled series present."""
    stats = Stats()
    stats.record_actions([Remind(1, "x", "repeat_reminder", "t", 3, 3, True)])
    stats.unguarded["not_json"] += 1
    stats.backend_errors["fetch"] += 1
    m = Metrics(stats)
    m.observe_added(0.001)
    return {s.name for family in text_string_to_metric_families(m.render().decode()) for s in family.samples}


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    dashboard = orjson.loads((DEPLOY / "grafana" / "dashboards" / "loopguard.json").read_bytes())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    named = {m for e in exprs for m in re.findall(r"\bloopguard_[a-z_]+", e)}
    assert named == {
        "loopguard_actions_total",
        "loopguard_added_latency_seconds_bucket",
        "loopguard_added_latency_seconds_sum",
        "loopguard_added_latency_seconds_count",
        "loopguard_internal_errors_total",
        "loopguard_state_backend_errors_total",
        "loopguard_upstream_errors_total",
        "loopguard_disconnects_total",
        "loopguard_requests_total",
        "loopguard_guarded_requests_total",
        "loopguard_rewritten_requests_total",
        "loopguard_unguarded_requests_total",
    }
    assert named - exported_samples() == set()
    # the actions panel keeps mode apart: an observed action is not an applied one
    (actions,) = [p for p in dashboard["panels"] if p["title"] == "Actions by rule and kind"]
    assert [t["expr"] for t in actions["targets"]] == [
        "sum by (rule, kind, mode) (rate(loopguard_actions_total[$__rate_interval]))"
    ]
    assert actions["targets"][0]["legendFormat"] == "{{rule}} {{kind}} {{mode}}"
    # the panels' datasource is the provisioned one
    datasources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = datasources["datasources"]
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {source["uid"]}
    assert source["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/loopguard.yml").read_text())
    grafana = compose()["services"]["grafana"]
    assert f"./grafana/dashboards:{provider['providers'][0]['options']['path']}:ro" in grafana["volumes"]
