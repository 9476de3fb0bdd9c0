#!/usr/bin/env python3
"""Runs one OpenCode agent scenario against an OpenAI-compatible server (see ../opencode.rs).

    run_scenario.py --base-url http://127.0.0.1:PORT/v1 --scenario read|shell --work-dir DIR

A fresh project directory under DIR holds a file with a random marker that the prompt does not
contain, and an `opencode.json` whose only provider is the server (`@ai-sdk/openai-compatible`,
bundled in the opencode binary). `opencode run --format json` runs the prompt with HOME and the
XDG directories under DIR, so the user's own OpenCode setup is neither read nor touched. Its
JSON events are summarised on stdout as one JSON object:

    {"scenario", "tool_called", "tool_names", "tool_calls", "marker_in_answer", "final_text",
     "exit_code", "timed_out", "errors", "seconds", "run_dir"}

`tool_called`: the scenario's tool (`read`, resp. `bash`) was executed, i.e. a tool part reached
the state `completed` or `error` (a wrong path still counts). `tool_returned_file`: a call of that
tool completed and its output holds the file's marker, i.e. the tool really read the file.
`final_text`: the assistant text
after the last tool part (all of it when no tool ran). The exit status is 0 whenever the scenario
could be run at all (the caller asserts on the report), 2 when it could not (no opencode, bad
arguments).

The run needs no network: autoupdate, sharing, LSP downloads and the models.dev fetch are off,
and the background `npm install @opencode-ai/plugin` that OpenCode starts in its config
directory runs with `npm_config_offline=true`, so it fails at once (logged as a warning) instead
of downloading ~60 MB on every run.
"""

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OPENCODE = HERE / "node_modules" / ".bin" / "opencode"
PROVIDER = "tinyllm"

# scenario -> (tool that must run, file name, prompt). The marker is only in the file, so it can
# reach the answer only through the tool's result.
# `{path}` becomes the file's absolute path: told only "notes.txt", the 0.5B model made up a
# directory (`project/files/notes.txt`) and the Read tool answered "File not found".
SCENARIOS = {
    "read": ("read", "notes.txt", "Read the file {path} and tell me the marker it contains."),
    "shell": (
        "bash",
        "secret.txt",
        "Run the shell command `cat secret.txt` with the bash tool and tell me what it printed.",
    ),
}


def config(base_url: str, model: str, context: int) -> dict:
    return {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "lsp": False,
        "formatter": False,
        "model": f"{PROVIDER}/{model}",
        "small_model": f"{PROVIDER}/{model}",
        # `opencode run` cannot answer permission prompts; these are the scenarios' tools.
        "permission": {"read": "allow", "bash": "allow"},
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "tinyllm",
                "options": {"baseURL": base_url, "apiKey": "unused"},
                "models": {
                    model: {
                        "name": model,
                        "tool_call": True,
                        "limit": {"context": context, "output": 2048},
                    }
                },
            }
        },
    }


def environment(run_dir: Path, project: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENCODE", "XDG_"))}
    home = run_dir / "home"
    env.update(
        # opencode takes its project directory from $PWD, not from the process's cwd.
        PWD=str(project),
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local/share"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_STATE_HOME=str(home / ".local/state"),
        OPENCODE_DISABLE_AUTOUPDATE="1",
        OPENCODE_DISABLE_SHARE="1",
        OPENCODE_DISABLE_MODELS_FETCH="1",
        OPENCODE_DISABLE_LSP_DOWNLOAD="1",
        OPENCODE_DISABLE_CLAUDE_CODE="1",
        OPENCODE_DISABLE_EXTERNAL_SKILLS="1",
        npm_config_offline="true",
        npm_config_update_notifier="false",
        NO_COLOR="1",
    )
    for d in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        Path(env[d]).mkdir(parents=True, exist_ok=True)
    return env


def summarise(events: list, tool: str, marker: str) -> dict:
    tool_calls, texts, errors = [], [], []
    for e in events:
        part = e.get("part") or {}
        if e.get("type") == "tool_use" or part.get("type") == "tool":
            state = part.get("state") or {}
            tool_calls.append(
                {
                    "tool": part.get("tool"),
                    "status": state.get("status"),
                    "input": state.get("input"),
                    "output": str(state.get("output", state.get("error", "")))[:300],
                    "full_output": str(state.get("output", "")),
                }
            )
            texts.append(None)  # a boundary: the final answer is the text after the last tool
        elif e.get("type") == "text" and part.get("text"):
            texts.append(part["text"])
        elif e.get("type") == "error":
            errors.append(e.get("error") or e)
    last = max((i for i, t in enumerate(texts) if t is None), default=-1)
    final_text = "".join(t for t in texts[last + 1 :] if t is not None)
    executed = [c for c in tool_calls if c["status"] in ("completed", "error")]
    returned_file = any(
        c["tool"] == tool and c["status"] == "completed" and marker in c.pop("full_output") for c in tool_calls
    )
    for c in tool_calls:
        c.pop("full_output", None)
    return {
        "tool_called": any(c["tool"] == tool for c in executed),
        "tool_returned_file": returned_file,
        "tool_names": [c["tool"] for c in tool_calls],
        "tool_calls": tool_calls,
        "marker_in_answer": marker in final_text,
        "final_text": final_text,
        "errors": errors,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True, help="the server's OpenAI base URL, ending in /v1")
    ap.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    ap.add_argument("--work-dir", required=True, help="where the run's project and HOME are made")
    ap.add_argument("--model", default="qwen2.5-coder:0.5b", help="model id sent to the server")
    ap.add_argument("--context", type=int, default=32768, help="context limit told to OpenCode")
    ap.add_argument("--timeout", type=float, default=900, help="seconds before opencode is killed")
    ap.add_argument("--opencode", default=os.environ.get("OPENCODE_BIN", str(DEFAULT_OPENCODE)))
    args = ap.parse_args()

    opencode = shutil.which(args.opencode) or args.opencode
    if not os.access(opencode, os.X_OK):
        print(
            f"opencode is not installed at {opencode}: run scripts/setup-test-deps.sh "
            f"(npm ci in {HERE})",
            file=sys.stderr,
        )
        return 2

    tool, file_name, prompt = SCENARIOS[args.scenario]
    work = Path(args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    run_dir = work / f"{args.scenario}-{secrets.token_hex(3)}"
    project = run_dir / "project"
    project.mkdir(parents=True)
    marker = f"MARKER-{secrets.token_hex(6)}"
    (project / file_name).write_text(f"{marker}\n")
    (project / "opencode.json").write_text(json.dumps(config(args.base_url, args.model, args.context), indent=2))

    cmd = [opencode, "run", "--print-logs", "--log-level", "INFO", "--model", f"{PROVIDER}/{args.model}"]
    cmd += ["--format", "json", prompt.format(path=project / file_name)]
    start = time.monotonic()
    timed_out = False
    proc = subprocess.Popen(
        cmd,
        cwd=project,
        env=environment(run_dir, project),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
    seconds = round(time.monotonic() - start, 1)
    (run_dir / "events.jsonl").write_text(out)
    (run_dir / "opencode.log").write_text(err)

    events = []
    for line in out.splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    report = {"scenario": args.scenario, "marker": marker}
    report.update(summarise(events, tool, marker))
    report.update(
        exit_code=None if timed_out else proc.returncode,
        timed_out=timed_out,
        seconds=seconds,
        events=len(events),
        run_dir=str(run_dir),
    )
    if not events:
        report["stderr_tail"] = err[-2000:]
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
