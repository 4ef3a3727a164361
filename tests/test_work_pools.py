"""Prefect as a service: a real `prefect server` and a `prefect worker` of a process pool on localhost
run a recipe that `infra/prefect/create-work-pool.sh` (through `posttrain serve --pool`) deployed, to
completion. The docker and kubernetes pools are created from infra/'s templates on the same server,
which checks every template variable is declared, and their jobs, rendered from the defaults with
Prefect's own templating, are checked against what Docker and Kubernetes require (no cluster or
Docker daemon is reachable here, and `kubectl --dry-run=client` needs a cluster's API)."""

import json
import os
import re
import signal
import subprocess
import time
import urllib.request

import pytest

from pipeline.launch.processes import free_port
from tests.conftest import POSTTRAIN, REPO, cli_env

pytestmark = pytest.mark.slow

PREFECT = str(REPO / ".venv" / "bin" / "prefect")
SCRIPT = str(REPO / "infra" / "prefect" / "create-work-pool.sh")
SHORT = ["stages.cold_start.max_steps=2", "stages.polish.max_steps=2", "eval=null"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A `prefect server` on a free localhost port with its own database; yields the env to reach it."""
    home = tmp_path_factory.mktemp("pool-home")
    port = free_port()
    env = {**cli_env(home), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"}
    proc = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                            stdout=open(home / "server.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 180
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2)
            break
        except OSError:
            assert proc.poll() is None and time.time() < deadline, (home / "server.log").read_text()[-3000:]
            time.sleep(1)
    yield env, home
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_process_pool_worker_runs_a_deployed_recipe_to_completion(server):
    env, home = server
    made = subprocess.run(["bash", SCRIPT, "process", "local", "tiny"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert made.returncode == 0, made.stdout + made.stderr
    assert "deployed 8 recipes to work pool 'local'" in made.stdout
    worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "local"], env=env, cwd=home,
                              stdout=open(home / "worker.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        run = subprocess.run([PREFECT, "deployment", "run", "posttrain/smoke-local", "--param", f"overrides={json.dumps(SHORT)}",
                              "--watch", "--watch-timeout", "600"], env=env, capture_output=True, text=True, timeout=660)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    assert run.returncode == 0 and "Completed" in run.stdout, run.stdout[-3000:] + (home / "worker.log").read_text()[-3000:]
    record = json.loads(subprocess.run([POSTTRAIN, "show", "latest", "--json"], env=env, capture_output=True,
                                       text=True, check=True).stdout)
    assert record["status"] == "completed" and [s["name"] for s in record["stages"]] == ["cold_start", "polish"]
    assert all((home / "stages" / "smoke").glob(f"{s}-*/result.json") for s in ("cold_start", "polish"))


def _render(template: dict) -> dict:
    from prefect.utilities.templating import apply_values

    defaults = {k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v}
    return apply_values(template["job_configuration"], {**defaults, "command": "prefect flow-run execute",
                                                        "name": "posttrain-run", "env": defaults.get("env", {})})


def test_docker_and_kubernetes_pools_take_infras_templates(server):
    env, _ = server
    for kind in ("docker", "kubernetes"):
        path = REPO / "infra" / "prefect" / f"{kind}-job-template.json"
        template = json.loads(path.read_text())
        made = subprocess.run(["bash", SCRIPT, kind, f"gpu-{kind}", "gpu"], env=env, capture_output=True, text=True,
                              timeout=300)
        assert made.returncode == 0, made.stdout + made.stderr  # the server refuses an undeclared variable
        pool = subprocess.run([PREFECT, "work-pool", "inspect", f"gpu-{kind}"], env=env, capture_output=True,
                              text=True, timeout=120).stdout
        assert "posttrain-worker:latest" in pool and "/data/posttrain" in pool
        deployment = subprocess.run([PREFECT, "deployment", "inspect", f"posttrain/r1-gpu-{kind}"], env=env,
                                    capture_output=True, text=True, timeout=120).stdout
        assert f"'work_pool_name': 'gpu-{kind}'" in deployment and "'image': 'posttrain-worker:latest'" in deployment
        from jsonschema import Draft202012Validator

        Draft202012Validator.check_schema(template["variables"])
        for prop in template["variables"]["properties"].values():
            if prop.get("default") is not None and "type" in prop:
                Draft202012Validator({**prop, "definitions": template["variables"].get("definitions", {})}) \
                    .validate(prop["default"])
    docker = _render(json.loads((REPO / "infra/prefect/docker-job-template.json").read_text()))
    assert docker["image"] == "posttrain-worker:latest" and docker["env"]["POSTTRAIN_HOME"] == "/data/posttrain"
    assert all(re.fullmatch(r"/[^:]+:/[^:]+", v) for v in docker["volumes"])

    job = _render(json.loads((REPO / "infra/prefect/kubernetes-job-template.json").read_text()))["job_manifest"]
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure") and "parallelism" not in pod
    (container,) = pod["containers"]
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", container["name"]) and container["image"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8 == container["resources"]["requests"]["nvidia.com/gpu"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        assert mount["name"] in volumes and mount["mountPath"].startswith("/")
    assert volumes["posttrain-home"]["persistentVolumeClaim"]["claimName"] == "posttrain-home"
    assert not re.search(r"\{\{.*?\}\}", json.dumps(job)), "a placeholder was left unrendered"
