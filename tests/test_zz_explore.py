import json
from pathlib import Path
import aiohttp
from tests.fakes import scripted_model, tool_call
from tests.py_agents import SMOLAGENTS, base_env, run_agent

async def test_explore(upstream, make_proxy, tmp_path: Path) -> None:
    smol = SMOLAGENTS.find()
    upstream.handler = scripted_model(lambda n: [tool_call("python_interpreter", json.dumps({"code": "print(open('/etc/hostname').read() if False else 42)"}), f"call_{n}")] if n < 12 else [tool_call("final_answer", json.dumps({"answer": "done"}), "cf")])
    base = await make_proxy()
    env = base_env(tmp_path / "home")
    run = await run_agent([smol, "Compute 42.", "--model-type", "OpenAIModel", "--action-type", "tool_calling", "--model-id", "fake-model", "--api-base", f"{base}/v1", "--api-key", "sk-x", "--tools", "python_interpreter"], tmp_path, env, timeout=120)
    Path("/tmp/hx/smol_stdout.txt").write_text(run.stdout + "\n----\n" + run.stderr)
    Path("/tmp/hx/smol_bodies.json").write_text(json.dumps([r.json() for r in upstream.requests], indent=1))
    async with aiohttp.ClientSession() as s, s.get(f"{base}/loop-guard") as r:
        Path("/tmp/hx/smol_stats.json").write_text(json.dumps(await r.json(), indent=1))
    print(run.returncode)
