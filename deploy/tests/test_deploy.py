"""Offline tests of deploy/: rendered manifests and the Dockerfile.

Run with `bash deploy/tests/run.sh` (also part of `bash scripts/test.sh`).
"""
from __future__ import annotations

import copy
import functools
import subprocess
import unittest

import checks as C

DOCKERFILE = C.DEPLOY / "docker" / "Dockerfile"


@functools.lru_cache(maxsize=None)
def _rendered(overlay: str) -> tuple:
    return tuple(C.render(C.K8S / ("base" if overlay == "base" else f"overlays/{overlay}")))


def rendered(overlay: str) -> list[dict]:
    """A fresh deep copy, so that a test may mutate it."""
    return copy.deepcopy(list(_rendered(overlay)))


def find(docs, kind, name):
    return C.one(docs, kind, name)


def container(docs, kind, name):
    return C.containers(find(docs, kind, name))[0]


def env(c, name):
    return next(e for e in c["env"] if e["name"] == name)


class RenderedOverlays(unittest.TestCase):
    """Every overlay passes every check."""

    def each(self, fn):
        for overlay, spec in C.OVERLAYS.items():
            with self.subTest(overlay=overlay):
                self.assertEqual(fn(rendered(overlay), spec), [])

    def test_base_renders_alone(self):
        docs = rendered("base")
        self.assertEqual(C.check_schemas(docs), [])
        self.assertEqual(C.check_selectors(docs), [])
        # Without the mtls component: no TLS, no health port, probes on the gRPC ports.
        self.assertEqual(C.check_probes(docs), [])
        self.assertEqual(C.check_tls(docs, enabled=False), [])
        self.assertEqual(C.check_network_policies(docs), [])

    def test_kubernetes_schemas(self):
        self.each(lambda d, s: C.check_schemas(d))

    def test_selectors_match_labels(self):
        self.each(lambda d, s: C.check_selectors(d))

    def test_probe_ports_match_service_ports(self):
        self.each(lambda d, s: C.check_probes(d))

    def test_coordinator(self):
        self.each(lambda d, s: C.check_coordinator(d))

    def test_learners_and_job_file(self):
        self.each(lambda d, s: C.check_learners(d, s["learners"]))

    def test_workers(self):
        self.each(lambda d, s: C.check_workers(d, s))

    def test_resources_and_gpus(self):
        self.each(lambda d, s: C.check_resources(d))

    def test_security(self):
        self.each(lambda d, s: C.check_security(d))

    def test_volumes_and_namespace(self):
        self.each(lambda d, s: C.check_volumes(d))

    def test_network_policies(self):
        self.each(lambda d, s: C.check_network_policies(d))

    def test_mutual_tls(self):
        self.each(lambda d, s: C.check_tls(d, s["tls"]))

    def test_concrete_values(self):
        # A few values spelled out, so that a check that silently passes on anything shows up.
        d = rendered("cluster")
        self.assertEqual(find(d, "StatefulSet", "learner")["spec"]["replicas"], 3)
        self.assertNotIn("replicas", find(d, "Deployment", "rollout-worker")["spec"])
        so = find(d, "ScaledObject", "rollout-worker")["spec"]
        self.assertEqual((so["minReplicaCount"], so["maxReplicaCount"]), (2, 16))
        self.assertEqual(find(d, "Service", "learner")["spec"]["clusterIP"], "None")
        w = container(d, "Deployment", "rollout-worker")
        self.assertEqual(w["readinessProbe"]["grpc"], {"port": 50072, "service": "comas.v1.RolloutWorker"})
        self.assertEqual(env(w, "COMAS_WORKER_HEALTH_LISTEN")["value"], "0.0.0.0:50072")
        self.assertEqual(env(w, "COMAS_TLS_KEY")["value"], "/etc/comas/tls/tls.key")
        self.assertEqual(env(w, "COMAS_TLS_SERVER_NAME")["value"], "comas-services")
        co = container(d, "Deployment", "coordinator")
        self.assertEqual(co["readinessProbe"]["grpc"], {"port": 50052, "service": "comas.v1.Coordinator"})
        self.assertEqual(C.ports_by_name(co)["health"], 50052)
        self.assertNotIn("COMAS_TLS_CLIENT_AUTH", C.env_map(co))
        le = container(d, "StatefulSet", "learner")
        self.assertEqual(le["livenessProbe"]["grpc"], {"port": 50062})
        self.assertEqual(env(le, "COMAS_TLS_CA")["value"], "/etc/comas/tls/ca.crt")
        tls = [v for v in C.pod_spec(find(d, "StatefulSet", "learner"))["volumes"] if v["name"] == "tls"]
        self.assertEqual(tls, [{"name": "tls", "secret": {"secretName": "comas-tls", "defaultMode": 0o440}}])
        self.assertEqual(w["resources"]["limits"]["nvidia.com/gpu"], 1)
        self.assertEqual(env(w, "COMAS_WORKER_COORDINATOR")["value"], "http://coordinator:50051")
        self.assertEqual(w["image"], "registry.example.com/comas/rollout-worker:0.1.0")
        s = rendered("single-node")
        self.assertEqual(find(s, "StatefulSet", "learner")["spec"]["replicas"], 2)
        self.assertEqual(find(s, "Deployment", "rollout-worker")["spec"]["replicas"], 1)
        self.assertIsNone(find(s, "ScaledObject", "rollout-worker"))
        self.assertEqual(container(s, "StatefulSet", "learner")["readinessProbe"]["grpc"]["port"], 50062)
        b = rendered("base")
        self.assertEqual(container(b, "Deployment", "rollout-worker")["readinessProbe"]["grpc"],
                         {"port": 50071, "service": "comas.v1.RolloutWorker"})
        self.assertNotIn("COMAS_TLS_CERT", C.env_map(container(b, "Deployment", "coordinator")))


class Dockerfile(unittest.TestCase):
    def test_structure(self):
        self.assertEqual(C.check_dockerfile(DOCKERFILE.read_text()), [])

    def test_hadolint(self):
        r = subprocess.run(
            [str(C.TOOLS / "hadolint"), "--no-color", "--config", str(DOCKERFILE.parent / "hadolint.yaml"),
             str(DOCKERFILE)], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_image_ports_match_manifests(self):
        ports = C.dockerfile_listen_ports(DOCKERFILE.read_text())
        d = rendered("cluster")
        for target, kind, prefix in (("coordinator", "Deployment", "COMAS_COORDINATOR"),
                                     ("learner", "StatefulSet", "COMAS_LEARNER"),
                                     ("rollout-worker", "Deployment", "COMAS_WORKER")):
            cports = C.ports_by_name(container(d, kind, target))
            self.assertEqual(ports[target][f"{prefix}_LISTEN"], cports["grpc"], target)
            self.assertEqual(ports[target][f"{prefix}_METRICS_LISTEN"], cports["metrics"], target)


def _mut(overlay, check, fn):
    return overlay, check, fn


def _set(kind, name, path, value):
    def f(docs):
        obj = find(docs, kind, name)
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return f


def _wc(kind, name, fn):
    """Mutate the first container of a workload."""
    def f(docs):
        fn(container(docs, kind, name))
    return f


def _env(kind, name, var, value):
    return _wc(kind, name, lambda c: env(c, var).__setitem__("value", value))


def _tls_volume(kind, name):
    """The Secret source of a workload's `tls` volume."""
    return lambda docs: next(v for v in C.pod_spec(find(docs, kind, name))["volumes"] if v["name"] == "tls")["secret"]


def _without_health_port(c):
    """TLS left on, but the health port and its listener gone and the probes back on `grpc`."""
    c["ports"] = [p for p in c["ports"] if p["name"] != "health"]
    c["env"] = [e for e in c["env"] if not e["name"].endswith("_HEALTH_LISTEN")]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if "grpc" in c.get(probe, {}):
            c[probe]["grpc"]["port"] = C.ports_by_name(c)["grpc"]


_CLUSTER, _SINGLE, _BASE = "cluster", "single-node", "base"
_workers = lambda d, s=C.OVERLAYS[_CLUSTER]: C.check_workers(d, s)  # noqa: E731
_learners = lambda d: C.check_learners(d, C.OVERLAYS[_CLUSTER]["learners"])  # noqa: E731
_tls = lambda d: C.check_tls(d, True)  # noqa: E731

# Each of these breaks one thing that matters; the named check must notice.
MUTATIONS = {
    "unknown field in a Deployment": _mut(_CLUSTER, C.check_schemas, _wc(
        "Deployment", "rollout-worker", lambda c: c.__setitem__("imagePullPolcy", "Always"))),
    "replicas as a string": _mut(_CLUSTER, C.check_schemas, _set("StatefulSet", "learner", ["spec", "replicas"], "3")),
    "a kind no schema knows": _mut(_CLUSTER, C.check_schemas, lambda d: d.append(
        {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "namespace": "comas"}})),
    "typo in the ScaledObject": _mut(_CLUSTER, C.check_schemas, lambda d: find(
        d, "ScaledObject", "rollout-worker")["spec"].__setitem__("maxReplicas", 4)),
    "worker readiness on another port": _mut(_CLUSTER, C.check_probes, _wc(
        "Deployment", "rollout-worker", lambda c: c["readinessProbe"]["grpc"].__setitem__("port", 50073))),
    "coordinator readiness on its TLS port": _mut(_CLUSTER, C.check_probes, _wc(
        "Deployment", "coordinator", lambda c: c["readinessProbe"]["grpc"].__setitem__("port", 50051))),
    "learner liveness on its TLS port": _mut(_SINGLE, C.check_probes, _wc(
        "StatefulSet", "learner", lambda c: c["livenessProbe"]["grpc"].__setitem__("port", 50061))),
    "health listener on another port": _mut(_CLUSTER, C.check_probes, _env(
        "Deployment", "rollout-worker", "COMAS_WORKER_HEALTH_LISTEN", "0.0.0.0:50073")),
    "health container port moved away from the probes": _mut(_CLUSTER, C.check_probes, _wc(
        "StatefulSet", "learner", lambda c: next(p for p in c["ports"] if p["name"] == "health").__setitem__(
            "containerPort", 50063))),
    "TLS on without a health port": _mut(_CLUSTER, C.check_probes, _wc(
        "Deployment", "coordinator", _without_health_port)),
    "base readiness on another port": _mut(_BASE, C.check_probes, _wc(
        "Deployment", "coordinator", lambda c: c["readinessProbe"]["grpc"].__setitem__("port", 50052))),
    "learner readiness on the wrong service": _mut(_CLUSTER, C.check_probes, _wc(
        "StatefulSet", "learner", lambda c: c["readinessProbe"]["grpc"].__setitem__("service", "comas.v1.Worker"))),
    "worker liveness waits for a job": _mut(_CLUSTER, C.check_probes, _wc(
        "Deployment", "rollout-worker",
        lambda c: c["livenessProbe"]["grpc"].__setitem__("service", "comas.v1.RolloutWorker"))),
    "listen address on another port": _mut(_CLUSTER, C.check_probes, _env(
        "StatefulSet", "learner", "COMAS_LEARNER_LISTEN", "0.0.0.0:50062")),
    "pod labels no longer match the selector": _mut(_CLUSTER, C.check_selectors, lambda d: find(
        d, "StatefulSet", "learner")["spec"]["template"]["metadata"]["labels"].__setitem__(
        "app.kubernetes.io/name", "learners")),
    "Service selects nothing": _mut(_CLUSTER, C.check_selectors, lambda d: find(
        d, "Service", "coordinator")["spec"]["selector"].__setitem__("app.kubernetes.io/name", "coord")),
    "Service port differs from the container port": _mut(_CLUSTER, C.check_selectors, lambda d: find(
        d, "Service", "learner")["spec"]["ports"][0].__setitem__("port", 50000)),
    "PDB selects nothing": _mut(_CLUSTER, C.check_selectors, lambda d: find(
        d, "PodDisruptionBudget", "rollout-worker")["spec"]["selector"]["matchLabels"].__setitem__(
        "app.kubernetes.io/name", "worker")),
    "learner Service not headless": _mut(_CLUSTER, _learners, lambda d: find(
        d, "Service", "learner")["spec"].pop("clusterIP")),
    "serviceName names no Service": _mut(_CLUSTER, _learners, _set(
        "StatefulSet", "learner", ["spec", "serviceName"], "learners")),
    "learner count differs from the job's agents": _mut(_CLUSTER, _learners, _set(
        "StatefulSet", "learner", ["spec", "replicas"], 4)),
    "no volumeClaimTemplates": _mut(_CLUSTER, _learners, lambda d: find(
        d, "StatefulSet", "learner")["spec"].pop("volumeClaimTemplates")),
    "agent id from a fixed value": _mut(_CLUSTER, _learners, _wc(
        "StatefulSet", "learner", lambda c: c.__setitem__("env", [
            {"name": "COMAS_LEARNER_AGENT_ID", "value": "0"} if e["name"] == "COMAS_LEARNER_AGENT_ID" else e
            for e in c["env"]]))),
    "grace period shorter than the drain": _mut(_CLUSTER, _workers, _set(
        "Deployment", "rollout-worker", ["spec", "template", "spec", "terminationGracePeriodSeconds"], 120)),
    "no /dev/shm": _mut(_CLUSTER, _workers, _wc("Deployment", "rollout-worker", lambda c: c.__setitem__(
        "volumeMounts", [m for m in c["volumeMounts"] if m["mountPath"] != "/dev/shm"]))),
    "worker dials a wrong coordinator name": _mut(_CLUSTER, _workers, _env(
        "Deployment", "rollout-worker", "COMAS_WORKER_COORDINATOR", "http://coordinatr:50051")),
    "POD_IP defined after its use": _mut(_CLUSTER, _workers, _wc("Deployment", "rollout-worker", lambda c: c.__setitem__(
        "env", [e for e in c["env"] if e["name"] != "POD_IP"] + [env(c, "POD_IP")]))),
    "autoscaler bounds changed": _mut(_CLUSTER, _workers, lambda d: find(
        d, "ScaledObject", "rollout-worker")["spec"].__setitem__("maxReplicaCount", 8)),
    "autoscaler on another metric": _mut(_CLUSTER, _workers, lambda d: find(
        d, "ScaledObject", "rollout-worker")["spec"]["triggers"][0]["metadata"].__setitem__(
        "valueLocation", "comas_coordinator_workers")),
    "autoscaler reads another namespace": _mut(_CLUSTER, _workers, lambda d: find(
        d, "ScaledObject", "rollout-worker")["spec"]["triggers"][0]["metadata"].__setitem__(
        "url", "http://coordinator.default.svc.cluster.local:9090/metrics")),
    "autoscaled Deployment keeps replicas": _mut(_CLUSTER, _workers, _set(
        "Deployment", "rollout-worker", ["spec", "replicas"], 2)),
    "fixed worker count changed": _mut(_SINGLE, lambda d: C.check_workers(d, C.OVERLAYS[_SINGLE]), _set(
        "Deployment", "rollout-worker", ["spec", "replicas"], 3)),
    "two coordinators": _mut(_CLUSTER, C.check_coordinator, _set("Deployment", "coordinator", ["spec", "replicas"], 2)),
    "no GPU limit on a worker": _mut(_CLUSTER, C.check_resources, _wc(
        "Deployment", "rollout-worker", lambda c: c["resources"]["limits"].pop("nvidia.com/gpu"))),
    "GPU request differs from limit": _mut(_CLUSTER, C.check_resources, _wc(
        "StatefulSet", "learner", lambda c: c["resources"]["requests"].__setitem__("nvidia.com/gpu", 2))),
    "GPU on the coordinator": _mut(_CLUSTER, C.check_resources, _wc(
        "Deployment", "coordinator", lambda c: c["resources"]["limits"].__setitem__("nvidia.com/gpu", 1))),
    "pod may run as root": _mut(_CLUSTER, C.check_security, _set(
        "Deployment", "coordinator", ["spec", "template", "spec", "securityContext", "runAsNonRoot"], False)),
    "writable root filesystem": _mut(_CLUSTER, C.check_security, _wc(
        "StatefulSet", "learner", lambda c: c["securityContext"].__setitem__("readOnlyRootFilesystem", False))),
    "claim that is not rendered": _mut(_CLUSTER, C.check_volumes, lambda d: next(
        v for v in C.pod_spec(find(d, "Deployment", "coordinator"))["volumes"] if v["name"] == "state")[
        "persistentVolumeClaim"].__setitem__("claimName", "missing")),
    "anyone may reach the workers": _mut(_CLUSTER, C.check_network_policies, lambda d: find(
        d, "NetworkPolicy", "rollout-worker-ingress")["spec"]["ingress"].append({"ports": [{"port": "grpc"}]})),
    "workers cut off from the coordinator": _mut(_CLUSTER, C.check_network_policies, lambda d: find(
        d, "NetworkPolicy", "coordinator-ingress")["spec"]["ingress"][0]["from"].pop()),
    "clients may reach the plaintext health port": _mut(_CLUSTER, C.check_network_policies, lambda d: find(
        d, "NetworkPolicy", "coordinator-ingress")["spec"]["ingress"][0]["ports"].append({"port": "health"})),
    "learner mounts another Secret": _mut(_CLUSTER, _tls, lambda d: _tls_volume("StatefulSet", "learner")(d).__setitem__(
        "secretName", "comas-tls-old")),
    "worker without the Secret": _mut(_SINGLE, _tls, _wc("Deployment", "rollout-worker", lambda c: c.__setitem__(
        "volumeMounts", [m for m in c["volumeMounts"] if m["name"] != "tls"]))),
    "TLS Secret mounted writable": _mut(_CLUSTER, _tls, _wc("Deployment", "coordinator", lambda c: next(
        m for m in c["volumeMounts"] if m["name"] == "tls").pop("readOnly"))),
    "TLS Secret mounted by subPath": _mut(_CLUSTER, _tls, _wc("Deployment", "coordinator", lambda c: next(
        m for m in c["volumeMounts"] if m["name"] == "tls").__setitem__("subPath", "tls.crt"))),
    "key file readable by everyone": _mut(_CLUSTER, _tls, lambda d: _tls_volume("Deployment", "coordinator")(d).__setitem__(
        "defaultMode", 0o444)),
    "worker pod without fsGroup": _mut(_CLUSTER, _tls, lambda d: find(d, "Deployment", "rollout-worker")[
        "spec"]["template"]["spec"]["securityContext"].pop("fsGroup")),
    "key path outside the mount": _mut(_CLUSTER, _tls, _env(
        "StatefulSet", "learner", "COMAS_TLS_KEY", "/etc/comas/tls-old/tls.key")),
    "CA variable names the key": _mut(_CLUSTER, _tls, _env(
        "Deployment", "rollout-worker", "COMAS_TLS_CA", "/etc/comas/tls/tls.key")),
    "a service checks another server name": _mut(_CLUSTER, _tls, _env(
        "StatefulSet", "learner", "COMAS_TLS_SERVER_NAME", "learner")),
    "coordinator admits clients without certificates": _mut(_CLUSTER, _tls, _wc(
        "Deployment", "coordinator", lambda c: c["env"].append({"name": "COMAS_TLS_CLIENT_AUTH", "value": "optional"}))),
    "TLS set in the base": _mut(_BASE, lambda d: C.check_tls(d, False), _wc(
        "Deployment", "coordinator", lambda c: c["env"].append({"name": "COMAS_TLS_CA", "value": "/ca.crt"}))),
}

DOCKER_MUTATIONS = {
    "runs as root": ("USER ${COMAS_UID}:${COMAS_UID}\nENTRYPOINT [\"/usr/local/bin/comas-coordinator\"]",
                     "USER root\nENTRYPOINT [\"/usr/local/bin/comas-coordinator\"]"),
    "fat runtime base": ("FROM runtime-base AS coordinator", "FROM build AS coordinator"),
    "no CUDA link": ("COMAS_CUDA=1", "COMAS_CUDA=0"),
    "binary not copied": ("COPY --from=build /out/comas-learner ", "COPY --from=torch /out/comas-learner "),
    "coordinator carries torch": ("FROM runtime-base AS coordinator", "FROM torch-runtime AS coordinator"),
}


class ChecksCanFail(unittest.TestCase):
    """Deliberately broken copies of the rendered manifests and the Dockerfile must be caught."""

    def test_manifest_mutations(self):
        for what, (overlay, check, mutate) in MUTATIONS.items():
            with self.subTest(what):
                docs = rendered(overlay)
                self.assertEqual(check(docs), [], "unmutated copy must pass")
                mutate(docs)
                self.assertNotEqual(check(docs), [], f"{what}: not detected")

    def test_dockerfile_mutations(self):
        text = DOCKERFILE.read_text()
        for what, (old, new) in DOCKER_MUTATIONS.items():
            with self.subTest(what):
                self.assertIn(old, text)
                self.assertNotEqual(C.check_dockerfile(text.replace(old, new)), [], f"{what}: not detected")


if __name__ == "__main__":
    unittest.main()
