"""Checks over rendered Kubernetes manifests and the Dockerfile.

Every check returns a list of problems (empty when all is well), so that the tests can assert
both that the shipped files pass and that deliberately broken copies fail.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import jsonschema
import kubernetes_validate
import yaml

DEPLOY = Path(__file__).resolve().parent.parent
K8S = DEPLOY / "k8s"
TOOLS = Path(sys.executable).parent

# 1.30 is the oldest Kubernetes these manifests support (the StatefulSet pod-index label needs
# 1.28, unhealthyPodEvictionPolicy is on by default from 1.27); 1.37 is the newest schema set
# that kubernetes-validate ships. Both are checked, strictly (unknown fields are errors).
K8S_VERSIONS = ("1.30.0", "1.37.0")
CRD_SCHEMAS = {("keda.sh/v1alpha1", "ScaledObject"): DEPLOY / "schemas" / "keda-scaledobject-v1alpha1.json"}

# What each overlay must render to. `tls`: the mtls component is on.
OVERLAYS = {
    "single-node": {"learners": 2, "workers": 1, "autoscaled": False, "tls": True},
    "cluster": {"learners": 3, "workers_min": 2, "workers_max": 16, "autoscaled": True, "tls": True},
}

HEALTH_NAMES = {
    "coordinator": "comas.v1.Coordinator",
    "learner": "comas.v1.Learner",
    "rollout-worker": "comas.v1.RolloutWorker",
}
# The env prefix of each service's own variables (*_LISTEN, *_METRICS_LISTEN, *_HEALTH_LISTEN).
ENV_PREFIX = {
    "coordinator": "COMAS_COORDINATOR",
    "learner": "COMAS_LEARNER",
    "rollout-worker": "COMAS_WORKER",
}
GPU_WORKLOADS = ("learner", "rollout-worker")
# The mtls component: one Secret (cert-manager's kubernetes.io/tls layout) mounted whole, the
# three path variables pointing at its keys, one server name shared by all services.
TLS_SECRET = "comas-tls"
TLS_FILES = {"COMAS_TLS_CERT": "tls.crt", "COMAS_TLS_KEY": "tls.key", "COMAS_TLS_CA": "ca.crt"}
TLS_SERVER_NAME = "comas-services"
CLIENT_LABEL = {"comas.io/client": "true"}
PENDING_METRIC = "comas_coordinator_pending_episodes"


# ------------------------------------------------------------------------------------------
# Rendering and lookup helpers


def render(path: Path) -> list[dict]:
    """`kubectl kustomize` (kustomize v5 built into kubectl) works offline, without a cluster."""
    out = subprocess.run(
        [str(TOOLS / "kubectl"), "kustomize", str(path)],
        check=True, capture_output=True, text=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def objs(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind, name):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found[0] if len(found) == 1 else None


def workloads(docs):
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def pod_spec(w):
    return w["spec"]["template"]["spec"]


def containers(w):
    return pod_spec(w).get("containers", [])


def env_map(c):
    return {e["name"]: e for e in c.get("env", [])}


def env_value(c, name):
    e = env_map(c).get(name)
    return None if e is None else e.get("value")


def ports_by_name(c):
    return {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p}


def matches(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def listen_port(addr: str | None) -> int | None:
    if not addr or ":" not in addr:
        return None
    try:
        return int(addr.rsplit(":", 1)[1])
    except ValueError:
        return None


def quantity(q) -> float:
    """Enough of Kubernetes quantities for comparisons here (integers, m, Ki..Ti, k..T)."""
    s = str(q)
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for u in sorted(units, key=len, reverse=True):
        if s.endswith(u):
            return float(s[: -len(u)]) * units[u]
    return float(s)


def job_of(docs) -> tuple[dict | None, str | None]:
    """The job file the learners mount, parsed, with the name of its ConfigMap."""
    ls = one(docs, "StatefulSet", "learner")
    if ls is None:
        return None, None
    for v in pod_spec(ls).get("volumes", []):
        if v["name"] == "job" and "configMap" in v:
            cm = one(docs, "ConfigMap", v["configMap"]["name"])
            if cm and "job.toml" in cm.get("data", {}):
                return tomllib.loads(cm["data"]["job.toml"]), cm["metadata"]["name"]
    return None, None


# ------------------------------------------------------------------------------------------
# Schemas


def check_schemas(docs, versions=K8S_VERSIONS) -> list[str]:
    problems = []
    for d in docs:
        what = f"{d.get('kind')}/{d.get('metadata', {}).get('name')}"
        crd = CRD_SCHEMAS.get((d.get("apiVersion"), d.get("kind")))
        if crd is not None:
            schema = json.loads(crd.read_text())
            for err in jsonschema.Draft202012Validator(schema).iter_errors(d):
                problems.append(f"{what}: {'/'.join(map(str, err.absolute_path))}: {err.message}")
            continue
        for version in versions:
            try:
                kubernetes_validate.validate(d, version, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                problems.append(f"{what}: no schema for {d.get('apiVersion')} in Kubernetes {version}")
            except kubernetes_validate.ValidationError as e:
                path = "/".join(map(str, e.path))
                problems.append(f"{what} (Kubernetes {version}): {path}: {e.message}")
    return problems


# ------------------------------------------------------------------------------------------
# Labels and selectors


def check_selectors(docs) -> list[str]:
    problems = []
    ws = workloads(docs)
    tmpl = {w["metadata"]["name"]: w["spec"]["template"]["metadata"].get("labels", {}) for w in ws}
    for w in ws:
        name = w["metadata"]["name"]
        sel = w["spec"]["selector"].get("matchLabels", {})
        if not matches(sel, tmpl[name]):
            problems.append(f"{w['kind']}/{name}: selector {sel} does not match its pod labels {tmpl[name]}")
        for t in pod_spec(w).get("topologySpreadConstraints", []):
            if not matches(t["labelSelector"].get("matchLabels", {}), tmpl[name]):
                problems.append(f"{w['kind']}/{name}: topology spread selector misses its own pods")
        # A selector shared with another workload would make them adopt each other's pods.
        for other in ws:
            if other is not w and matches(sel, tmpl[other["metadata"]["name"]]):
                problems.append(f"{w['kind']}/{name}: selector also matches {other['metadata']['name']}")

    def selected(sel):
        return [w for w in ws if matches(sel, tmpl[w["metadata"]["name"]])]

    for s in objs(docs, "Service"):
        name = s["metadata"]["name"]
        targets = selected(s["spec"].get("selector", {}))
        if len(targets) != 1:
            problems.append(f"Service/{name}: selects {len(targets)} workloads, want 1")
            continue
        for p in s["spec"]["ports"]:
            tp = p.get("targetPort", p["port"])
            cports = {}
            for c in containers(targets[0]):
                cports.update(ports_by_name(c))
            if isinstance(tp, str):
                if tp not in cports:
                    problems.append(f"Service/{name}: targetPort {tp!r} is no container port")
                elif cports[tp] != p["port"]:
                    # The job file and COMAS_WORKER_COORDINATOR use the Service port numbers.
                    problems.append(f"Service/{name}: port {p['port']} != container port {tp}={cports[tp]}")
            elif tp not in cports.values():
                problems.append(f"Service/{name}: targetPort {tp} is no container port")
    for pdb in objs(docs, "PodDisruptionBudget"):
        if len(selected(pdb["spec"]["selector"].get("matchLabels", {}))) != 1:
            problems.append(f"PodDisruptionBudget/{pdb['metadata']['name']}: selects no single workload")
    for np in objs(docs, "NetworkPolicy"):
        name = np["metadata"]["name"]
        sel = np["spec"]["podSelector"].get("matchLabels", {})
        if sel and not selected(sel):
            problems.append(f"NetworkPolicy/{name}: podSelector {sel} selects nothing")
        for rule in np["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                psel = peer.get("podSelector", {}).get("matchLabels")
                if psel and psel != CLIENT_LABEL and not selected(psel):
                    problems.append(f"NetworkPolicy/{name}: peer {psel} selects nothing")
    for so in objs(docs, "ScaledObject"):
        ref = so["spec"]["scaleTargetRef"]
        if one(docs, ref.get("kind", "Deployment"), ref["name"]) is None:
            problems.append(f"ScaledObject/{so['metadata']['name']}: target {ref['name']} missing")
    return problems


# ------------------------------------------------------------------------------------------
# Ports, probes and the env that names them


def _probe_port(probe, cports):
    for kind in ("grpc", "httpGet", "tcpSocket"):
        if kind in probe:
            port = probe[kind].get("port")
            return kind, (cports.get(port) if isinstance(port, str) else port)
    return None, None


def check_probes(docs) -> list[str]:
    """gRPC probes dial the plaintext `health` port where a container has one, else `grpc`.

    The kubelet's gRPC probe speaks plaintext only, so a container with TLS on (COMAS_TLS_*)
    must have a `health` port, served by its *_HEALTH_LISTEN, and no gRPC probe on `grpc`.
    """
    problems = []
    for w in workloads(docs):
        name = w["metadata"]["name"]
        for c in containers(w):
            cports = ports_by_name(c)
            where = f"{w['kind']}/{name}/{c['name']}"
            if "grpc" not in cports:
                problems.append(f"{where}: no container port named grpc")
                continue
            prefix = ENV_PREFIX.get(name)
            tls = any(k in env_map(c) for k in TLS_FILES)
            probe_port = cports.get("health", cports["grpc"])
            if tls and "health" not in cports:
                problems.append(f"{where}: TLS is on, but no plaintext container port named health "
                                "for the kubelet's gRPC probes")
            if prefix and "health" in cports:
                hl = env_value(c, f"{prefix}_HEALTH_LISTEN")
                if listen_port(hl) != cports["health"]:
                    problems.append(f"{where}: {prefix}_HEALTH_LISTEN={hl!r} does not listen on port "
                                    f"health={cports['health']}")
                elif not hl.startswith("0.0.0.0:"):
                    problems.append(f"{where}: {prefix}_HEALTH_LISTEN must bind all interfaces (the kubelet "
                                    "dials the pod IP)")
                if cports["health"] in (cports["grpc"], cports.get("metrics")):
                    problems.append(f"{where}: port health shares a number with another port")
            elif prefix and env_value(c, f"{prefix}_HEALTH_LISTEN") is not None:
                problems.append(f"{where}: {prefix}_HEALTH_LISTEN is set, but no container port is named health")
            for pname in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = c.get(pname)
                if probe is None:
                    problems.append(f"{where}: no {pname}")
                    continue
                kind, port = _probe_port(probe, cports)
                if port not in cports.values():
                    problems.append(f"{where}: {pname} port {port} is no container port")
                if kind == "grpc" and port != probe_port:
                    what = "the plaintext health port" if "health" in cports else "gRPC"
                    problems.append(f"{where}: {pname} dials {port}, {what} listens on {probe_port}")
            ready = c.get("readinessProbe", {})
            if ready.get("grpc", {}).get("service") != HEALTH_NAMES.get(name):
                problems.append(f"{where}: readiness must ask for {HEALTH_NAMES.get(name)}")
            live = c.get("livenessProbe", {})
            if "grpc" in live and live["grpc"].get("service", ""):
                problems.append(f"{where}: liveness must ask for the whole server (empty service)")
            # Env listeners must agree with the declared ports.
            if prefix:
                if listen_port(env_value(c, f"{prefix}_LISTEN")) != cports["grpc"]:
                    problems.append(f"{where}: {prefix}_LISTEN does not listen on port grpc")
                if not str(env_value(c, f"{prefix}_LISTEN")).startswith("0.0.0.0:"):
                    problems.append(f"{where}: {prefix}_LISTEN must bind all interfaces")
                if listen_port(env_value(c, f"{prefix}_METRICS_LISTEN")) != cports.get("metrics"):
                    problems.append(f"{where}: {prefix}_METRICS_LISTEN does not listen on port metrics")
    return problems


# ------------------------------------------------------------------------------------------
# Mutual TLS (components/mtls)


def check_tls(docs, enabled: bool) -> list[str]:
    """With the mtls component every service mounts Secret comas-tls and points COMAS_TLS_* at it;
    without it, none has any TLS setting, Secret or health port."""
    p = []
    names = set()
    for w in workloads(docs):
        name = w["metadata"]["name"]
        if name not in ENV_PREFIX:
            continue
        ps = pod_spec(w)
        c = containers(w)[0]
        env = env_map(c)
        vols = {v["name"]: v for v in ps.get("volumes", [])}
        secret_vols = {n for n, v in vols.items() if v.get("secret", {}).get("secretName") == TLS_SECRET}
        mounts = [m for m in c.get("volumeMounts", []) if m["name"] in secret_vols]
        tls_env = sorted(k for k in env if k.startswith("COMAS_TLS_"))
        if not enabled:
            if secret_vols or tls_env or "health" in ports_by_name(c):
                p.append(f"{name}: TLS is off here, but it mounts {TLS_SECRET}, sets {tls_env} "
                         "or has a health port")
            continue
        if len(mounts) != 1:
            p.append(f"{name}: must mount Secret {TLS_SECRET} exactly once, mounts it {len(mounts)} times")
            continue
        m, sec = mounts[0], vols[mounts[0]["name"]]["secret"]
        if m.get("readOnly") is not True:
            p.append(f"{name}: {TLS_SECRET} must be mounted read-only")
        if m.get("subPath") or m.get("subPathExpr"):
            p.append(f"{name}: {TLS_SECRET} mounted by subPath never sees a renewed certificate")
        if sec.get("items"):
            p.append(f"{name}: mount the whole Secret (no items), in cert-manager's layout")
        if sec.get("optional"):
            p.append(f"{name}: the Secret must not be optional (a service without it would fail to start)")
        # Secret files belong to root (group fsGroup when set): uid 10001 reads them through the
        # group bit and fsGroup; nothing may read them as `other`, nobody may write them.
        mode = sec.get("defaultMode", 0o644)
        if ps.get("securityContext", {}).get("fsGroup") is None:
            p.append(f"{name}: no pod fsGroup, so the non-root service cannot read {TLS_SECRET} without "
                     "making it world-readable")
        if not mode & 0o040 or mode & 0o007 or mode & 0o222:
            p.append(f"{name}: {TLS_SECRET} files have mode {oct(mode)}, want group-readable and no "
                     "access for others, no write (0440)")
        root = m["mountPath"].rstrip("/")
        for var, key in TLS_FILES.items():
            got = env_value(c, var)
            if got != f"{root}/{key}":
                p.append(f"{name}: {var}={got!r}, want {root}/{key} (key {key} of {TLS_SECRET})")
        server_name = env_value(c, "COMAS_TLS_SERVER_NAME")
        names.add(server_name)
        if server_name != TLS_SERVER_NAME:
            p.append(f"{name}: COMAS_TLS_SERVER_NAME={server_name!r}, want the shared {TLS_SERVER_NAME!r}")
        if env_value(c, "COMAS_TLS_CLIENT_AUTH") not in (None, "required"):
            p.append(f"{name}: client certificates must be required by default (an overlay of your own "
                     "may relax the coordinator's)")
        if "health" not in ports_by_name(c):
            p.append(f"{name}: TLS on, but no plaintext health port for the kubelet's probes")
    if enabled and len(names) > 1:
        p.append(f"services check different server names {sorted(map(str, names))}; they share one certificate")
    return p


# ------------------------------------------------------------------------------------------
# Per-service rules


def check_coordinator(docs) -> list[str]:
    p = []
    d = one(docs, "Deployment", "coordinator")
    svc = one(docs, "Service", "coordinator")
    if d is None or svc is None:
        return ["coordinator Deployment or Service missing"]
    if d["spec"].get("replicas") != 1:
        p.append("coordinator: replicas must be 1 (one SQLite writer)")
    if d["spec"].get("strategy", {}).get("type") != "Recreate":
        p.append("coordinator: strategy must be Recreate")
    if svc["spec"].get("clusterIP") == "None":
        p.append("coordinator: clients need a ClusterIP Service, not a headless one")
    c = containers(d)[0]
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    vols = {v["name"]: v for v in pod_spec(d).get("volumes", [])}
    db = env_value(c, "COMAS_COORDINATOR_DB") or ""
    on_pvc = [n for n, path in mounts.items()
              if db.startswith(path.rstrip("/") + "/") and "persistentVolumeClaim" in vols.get(n, {})]
    if not on_pvc:
        p.append(f"coordinator: COMAS_COORDINATOR_DB={db!r} is not on a PersistentVolumeClaim")
    return p


def check_learners(docs, expected: int) -> list[str]:
    p = []
    sts = one(docs, "StatefulSet", "learner")
    if sts is None:
        return ["learner StatefulSet missing"]
    svc = one(docs, "Service", sts["spec"].get("serviceName", ""))
    if svc is None:
        p.append(f"learner: serviceName {sts['spec'].get('serviceName')!r} names no Service")
    elif svc["spec"].get("clusterIP") != "None":
        p.append("learner: its Service must be headless (clusterIP: None) for learner-k DNS names")
    if sts["spec"].get("replicas") != expected:
        p.append(f"learner: replicas {sts['spec'].get('replicas')} != {expected}")
    c = containers(sts)[0]
    agent = env_map(c).get("COMAS_LEARNER_AGENT_ID", {})
    if ((agent.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") != \
            "metadata.labels['apps.kubernetes.io/pod-index']":
        p.append("learner: COMAS_LEARNER_AGENT_ID must come from the pod-index label")
    if env_value(c, "COMAS_LEARNER_RESUME") != "true":
        p.append("learner: COMAS_LEARNER_RESUME must be true")
    templates = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    ckpt = env_value(c, "COMAS_LEARNER_CHECKPOINT_DIR") or ""
    if not any(ckpt.startswith(path.rstrip("/") + "/") and name in templates for path, name in mounts.items()):
        p.append(f"learner: checkpoint dir {ckpt!r} is not on a volumeClaimTemplate")
    # The job file: mounted from its ConfigMap, one agent per learner, addresses via the Service.
    job, _ = job_of(docs)
    if job is None:
        return p + ["learner: no job ConfigMap with job.toml mounted as volume `job`"]
    job_path = env_value(c, "COMAS_LEARNER_JOB") or ""
    if mounts.get(job_path.rsplit("/", 1)[0]) != "job":
        p.append(f"learner: COMAS_LEARNER_JOB={job_path!r} is not in the job volume")
    agents = job.get("agents", [])
    if len(agents) != sts["spec"].get("replicas"):
        p.append(f"learner: {len(agents)} agents in the job, {sts['spec'].get('replicas')} learners")
    port = ports_by_name(c).get("grpc")
    svc_name = sts["spec"].get("serviceName")
    for k, a in enumerate(agents):
        if a.get("id", k) != k:
            p.append(f"job: agents[{k}].id = {a.get('id')}")
        want = f"http://learner-{k}.{svc_name}:{port}"
        if a.get("learner") != want:
            p.append(f"job: agents[{k}].learner = {a.get('learner')!r}, want {want!r}")
        if not str(a.get("model", "")).startswith("/models/"):
            p.append(f"job: agents[{k}].model is not on the /models volume")
        if not str(a.get("train", {}).get("device", "")).startswith("cuda"):
            p.append(f"job: agents[{k}].train.device must be cuda on GPU learners")
    if not str(job.get("output", {}).get("dir", "")).startswith("/var/lib/comas/"):
        p.append("job: output.dir must be under /var/lib/comas (the pods' own volumes)")
    if not str(job.get("data", {}).get("train", "")).startswith("/data/"):
        p.append("job: data.train must be on the /data volume")
    return p


def check_workers(docs, spec: dict) -> list[str]:
    p = []
    d = one(docs, "Deployment", "rollout-worker")
    coord = one(docs, "Service", "coordinator")
    if d is None or coord is None:
        return ["rollout-worker Deployment or coordinator Service missing"]
    ps = pod_spec(d)
    c = containers(d)[0]
    drain = int(env_value(c, "COMAS_WORKER_DRAIN_SECS") or 120)
    if ps.get("terminationGracePeriodSeconds", 30) <= drain:
        p.append(f"rollout-worker: grace period {ps.get('terminationGracePeriodSeconds', 30)}s "
                 f"does not cover the {drain}s drain")
    vols = {v["name"]: v for v in ps.get("volumes", [])}
    shm = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
    if not shm or vols.get(shm[0]["name"], {}).get("emptyDir", {}).get("medium") != "Memory":
        p.append("rollout-worker: /dev/shm must be a memory-backed emptyDir")
    startup = c.get("startupProbe", {})
    if startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3) < 300:
        p.append("rollout-worker: startup probe allows less than 5 minutes")
    if startup.get("grpc", {}).get("service"):
        p.append("rollout-worker: startup probe must not wait for a job (use the empty service)")
    # Registration: coordinator by Service name and gRPC port; advertised address uses POD_IP.
    url = urlparse(env_value(c, "COMAS_WORKER_COORDINATOR") or "")
    coord_port = {q["name"]: q["port"] for q in coord["spec"]["ports"]}.get("grpc")
    if url.hostname != coord["metadata"]["name"] or url.port != coord_port:
        p.append(f"rollout-worker: COMAS_WORKER_COORDINATOR {url.geturl()!r} is not the coordinator Service")
    names = [e["name"] for e in c.get("env", [])]
    adv = env_value(c, "COMAS_WORKER_ADVERTISE") or ""
    if "$(POD_IP)" not in adv or "POD_IP" not in names or \
            names.index("POD_IP") > names.index("COMAS_WORKER_ADVERTISE"):
        p.append("rollout-worker: COMAS_WORKER_ADVERTISE must expand POD_IP, defined before it")
    elif env_map(c)["POD_IP"].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "status.podIP":
        p.append("rollout-worker: POD_IP must come from status.podIP")
    if listen_port(adv) != ports_by_name(c).get("grpc"):
        p.append("rollout-worker: advertised port is not the gRPC port")
    pdbs = [x for x in objs(docs, "PodDisruptionBudget")
            if matches(x["spec"]["selector"].get("matchLabels", {}), d["spec"]["template"]["metadata"]["labels"])]
    if len(pdbs) != 1:
        p.append("rollout-worker: needs exactly one PodDisruptionBudget")
    # Replica count: fixed, or owned by the autoscaler.
    sos = objs(docs, "ScaledObject")
    if spec["autoscaled"]:
        if "replicas" in d["spec"]:
            p.append("rollout-worker: autoscaled, so the Deployment must not set replicas")
        if len(sos) != 1:
            return p + [f"rollout-worker: {len(sos)} ScaledObjects, want 1"]
        so = sos[0]["spec"]
        if (so.get("minReplicaCount"), so.get("maxReplicaCount")) != (spec["workers_min"], spec["workers_max"]):
            p.append(f"rollout-worker: scales {so.get('minReplicaCount')}..{so.get('maxReplicaCount')}, "
                     f"want {spec['workers_min']}..{spec['workers_max']}")
        if so.get("minReplicaCount", 0) < 1:
            p.append("rollout-worker: keep at least one warm worker")
        trig = so["triggers"][0]["metadata"]
        if trig.get("valueLocation") != PENDING_METRIC or trig.get("format") != "prometheus":
            p.append(f"rollout-worker: autoscaling must read {PENDING_METRIC}")
        if trig.get("targetValue") != env_value(c, "COMAS_WORKER_MAX_EPISODES"):
            p.append("rollout-worker: targetValue must equal COMAS_WORKER_MAX_EPISODES (one worker's capacity)")
        mu = urlparse(trig.get("url", ""))
        want_host = f"{coord['metadata']['name']}.{coord['metadata'].get('namespace')}.svc.cluster.local"
        metrics_port = {q["name"]: q["port"] for q in coord["spec"]["ports"]}.get("metrics")
        if mu.hostname != want_host or mu.port != metrics_port or mu.path != "/metrics":
            p.append(f"rollout-worker: scaler URL {mu.geturl()!r}, want http://{want_host}:{metrics_port}/metrics")
        if so["triggers"][0].get("type") == "cpu":
            p.append("rollout-worker: must not scale on CPU")
    else:
        if sos:
            p.append("rollout-worker: not autoscaled here, but a ScaledObject is rendered")
        if d["spec"].get("replicas") != spec["workers"]:
            p.append(f"rollout-worker: replicas {d['spec'].get('replicas')} != {spec['workers']}")
    return p


def check_resources(docs) -> list[str]:
    p = []
    for w in workloads(docs):
        name = w["metadata"]["name"]
        for c in containers(w):
            res = c.get("resources", {})
            req, lim = res.get("requests", {}), res.get("limits", {})
            if "cpu" not in req or "memory" not in req:
                p.append(f"{name}: cpu and memory requests required")
            if "memory" in req and "memory" in lim and quantity(lim["memory"]) < quantity(req["memory"]):
                p.append(f"{name}: memory limit below request")
            gpu_req, gpu_lim = req.get("nvidia.com/gpu"), lim.get("nvidia.com/gpu")
            if name in GPU_WORKLOADS:
                if gpu_lim is None or int(gpu_lim) < 1:
                    p.append(f"{name}: needs an nvidia.com/gpu limit")
                elif gpu_req is not None and int(gpu_req) != int(gpu_lim):
                    p.append(f"{name}: nvidia.com/gpu request {gpu_req} != limit {gpu_lim}")
            elif gpu_req or gpu_lim:
                p.append(f"{name}: takes a GPU it does not use")
    return p


def check_security(docs) -> list[str]:
    p = []
    for w in workloads(docs):
        name = w["metadata"]["name"]
        ps = pod_spec(w)
        sc = ps.get("securityContext", {})
        if sc.get("runAsNonRoot") is not True or not sc.get("runAsUser"):
            p.append(f"{name}: pod must run as a non-root uid")
        if ps.get("automountServiceAccountToken") is not False:
            p.append(f"{name}: the services never call the API server; do not mount a token")
        for c in ps.get("containers", []):
            csc = c.get("securityContext", {})
            if csc.get("allowPrivilegeEscalation") is not False:
                p.append(f"{name}/{c['name']}: allowPrivilegeEscalation must be false")
            if "ALL" not in csc.get("capabilities", {}).get("drop", []):
                p.append(f"{name}/{c['name']}: must drop all capabilities")
            if csc.get("readOnlyRootFilesystem") is not True:
                p.append(f"{name}/{c['name']}: root filesystem must be read-only")
            if csc.get("runAsUser") == 0 or csc.get("privileged"):
                p.append(f"{name}/{c['name']}: runs as root or privileged")
    return p


def check_volumes(docs, namespace="comas") -> list[str]:
    p = []
    pvcs = {d["metadata"]["name"] for d in objs(docs, "PersistentVolumeClaim")}
    cms = {d["metadata"]["name"] for d in objs(docs, "ConfigMap")}
    for w in workloads(docs):
        for v in pod_spec(w).get("volumes", []):
            if "persistentVolumeClaim" in v and v["persistentVolumeClaim"]["claimName"] not in pvcs:
                p.append(f"{w['metadata']['name']}: claim {v['persistentVolumeClaim']['claimName']} not rendered")
            if "configMap" in v and v["configMap"]["name"] not in cms:
                p.append(f"{w['metadata']['name']}: ConfigMap {v['configMap']['name']} not rendered")
        names = {v["name"] for v in pod_spec(w).get("volumes", [])} | \
            {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        for c in containers(w):
            for m in c.get("volumeMounts", []):
                if m["name"] not in names:
                    p.append(f"{w['metadata']['name']}: mount {m['name']} has no volume")
            if any(m["mountPath"] == "/models" and not m.get("readOnly") for m in c.get("volumeMounts", [])):
                p.append(f"{w['metadata']['name']}: /models must be mounted read-only")
    for d in docs:
        if d["kind"] != "Namespace" and d["metadata"].get("namespace") != namespace:
            p.append(f"{d['kind']}/{d['metadata']['name']}: namespace {d['metadata'].get('namespace')!r}")
    return p


def _allowed_peers(docs, pod_name: str, port_name: str):
    """Peers (as matchLabels dicts, or ('ns', labels)) allowed to reach `port_name` of a pod."""
    w = one(docs, "Deployment", pod_name) or one(docs, "StatefulSet", pod_name)
    labels = w["spec"]["template"]["metadata"]["labels"]
    cports = {}
    for c in containers(w):
        cports.update(ports_by_name(c))
    peers, selected = [], False
    for np in objs(docs, "NetworkPolicy"):
        sel = np["spec"]["podSelector"].get("matchLabels", {})
        if sel and not matches(sel, labels):
            continue
        if not sel and "matchExpressions" in np["spec"]["podSelector"]:
            continue
        if "Ingress" in np["spec"].get("policyTypes", ["Ingress"]):
            selected = True
        for rule in np["spec"].get("ingress", []):
            rports = rule.get("ports")
            if rports and not any(rp.get("port") in (port_name, cports.get(port_name)) for rp in rports):
                continue
            if "from" not in rule or not rule["from"]:
                peers.append("anyone")
            for peer in rule.get("from", []):
                if "ipBlock" in peer:
                    peers.append("anyone")
                elif "namespaceSelector" in peer:
                    peers.append(("ns", json.dumps(peer["namespaceSelector"], sort_keys=True)))
                else:
                    peers.append(json.dumps(peer.get("podSelector", {}).get("matchLabels", {}), sort_keys=True))
    return selected, peers


def check_network_policies(docs) -> list[str]:
    p = []
    lab = lambda name: json.dumps({"app.kubernetes.io/name": name}, sort_keys=True)  # noqa: E731
    want = {
        ("rollout-worker", "grpc"): {lab("coordinator"), lab("learner")},
        ("coordinator", "grpc"): {json.dumps(CLIENT_LABEL, sort_keys=True), lab("rollout-worker")},
        ("learner", "grpc"): {lab("coordinator"), lab("rollout-worker")},
    }
    for (pod, port), allowed in want.items():
        selected, peers = _allowed_peers(docs, pod, port)
        if not selected:
            p.append(f"{pod}: no NetworkPolicy restricts its ingress")
        if set(peers) != allowed:
            p.append(f"{pod}:{port} reachable from {sorted(map(str, set(peers)))}, want {sorted(allowed)}")
    # The plaintext health ports are for the kubelet (from the node, not subject to the
    # policies); no pod may reach them.
    for pod in ENV_PREFIX:
        w = one(docs, "Deployment", pod) or one(docs, "StatefulSet", pod)
        if w is None or not any("health" in ports_by_name(c) for c in containers(w)):
            continue
        _, peers = _allowed_peers(docs, pod, "health")
        if peers:
            p.append(f"{pod}:health reachable from {sorted(map(str, set(peers)))}, want no one")
    deny = [np for np in objs(docs, "NetworkPolicy")
            if np["spec"]["podSelector"] == {} and not np["spec"].get("ingress")]
    if not deny:
        p.append("no default-deny ingress policy")
    return p


# ------------------------------------------------------------------------------------------
# Dockerfile


def parse_dockerfile(text: str) -> tuple[dict, list[dict]]:
    """Global ARG defaults and stages: {name, base, instrs: [(INSTR, args)]}."""
    lines, buf = [], ""
    for raw in text.splitlines():
        s = raw.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if buf and s.startswith("#"):
            continue
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        lines.append(buf + s)
        buf = ""
    args, stages = {}, []
    for line in lines:
        instr, _, rest = line.partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            m = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", rest.strip(), re.I)
            stages.append({"name": m.group(2), "base": m.group(1), "instrs": []})
        elif not stages and instr == "ARG":
            k, _, v = rest.strip().partition("=")
            args[k] = v
        elif stages:
            stages[-1]["instrs"].append((instr, rest.strip()))
    return args, stages


def _subst(s: str, args: dict) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), s)


def check_dockerfile(text: str) -> list[str]:
    p = []
    args, stages = parse_dockerfile(text)
    by_name = {s["name"]: s for s in stages if s["name"]}

    def chain(stage):
        out = [stage]
        while stage["base"] in by_name:
            stage = by_name[stage["base"]]
            out.append(stage)
        return out

    build = by_name.get("build")
    if build is None:
        return ["no `build` stage"]
    env = " ".join(a for i, a in build["instrs"] if i == "ENV")
    run = " ".join(a for i, a in build["instrs"] if i == "RUN")
    if "COMAS_CUDA=1" not in env or "LIBTORCH=${TORCH_PREFIX}/torch" not in env:
        p.append("build: needs COMAS_CUDA=1 and LIBTORCH=${TORCH_PREFIX}/torch")
    if "cargo build --release --locked" not in run:
        p.append("build: must run `cargo build --release --locked`")
    targets = {
        "coordinator": ("comas-coordinator", False),
        "rollout-worker": ("comas-rollout-worker", True),
        "learner": ("comas-learner", True),
        "cli": ("comas", True),
    }
    for target, (binary, torch) in targets.items():
        st = by_name.get(target)
        if st is None:
            p.append(f"no `{target}` target")
            continue
        if f"-p {binary}" not in run:
            p.append(f"build: does not build {binary}")
        names = [s["name"] for s in chain(st)]
        root = _subst(chain(st)[-1]["base"], args)
        if not root.endswith("-slim") or "build" in names:
            p.append(f"{target}: runtime must start from a slim base, got {root}")
        if ("torch-runtime" in names) != torch:
            p.append(f"{target}: {'needs' if torch else 'must not carry'} libtorch")
        instrs = st["instrs"]
        if not any(i == "COPY" and "--from=build" in a and f"/out/{binary} " in a for i, a in instrs):
            p.append(f"{target}: no COPY --from=build of {binary}")
        users = [a for i, a in instrs if i == "USER"]
        uid = _subst(users[-1], args).split(":")[0] if users else "0"
        if not uid.isdigit() or int(uid) == 0:
            p.append(f"{target}: final USER must be a numeric non-root uid, got {uid!r}")
        entry = [a for i, a in instrs if i == "ENTRYPOINT"]
        if not entry or json.loads(entry[-1])[0] != f"/usr/local/bin/{binary}":
            p.append(f"{target}: ENTRYPOINT must run {binary}")
    torch_rt = by_name.get("torch-runtime")
    if torch_rt and not any(i == "COPY" and "--from=torch" in a and a.endswith("${TORCH_PREFIX}/")
                            for i, a in torch_rt["instrs"]):
        p.append("torch-runtime: libraries must land at TORCH_PREFIX, the path binaries' rpath names")
    return p


def dockerfile_listen_ports(text: str) -> dict:
    """{target: {ENV name: port}} for the *_LISTEN defaults baked into the images."""
    _, stages = parse_dockerfile(text)
    out = {}
    for st in stages:
        for i, a in st["instrs"]:
            if i == "ENV":
                for k, v in re.findall(r"(\w+_LISTEN)=(\S+)", a):
                    out.setdefault(st["name"], {})[k] = listen_port(v)
    return out
