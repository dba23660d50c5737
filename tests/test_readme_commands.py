"""Every command that README.md, docs/*.md and the other READMEs show still parses, and every
relative link in them names a file (and a heading) that exists.

Commands are taken from fenced code blocks (lines joined at a trailing backslash, comments
dropped, `a && b` split) and from inline code spans that start like a command
(`python -m ...`, `bash ...`, `PYTHONPATH=... python ...`). Each is checked without running it:

- `python -m roll_agent.run [--config F] [overrides...]`: parsed by run.py's own `parse_args`,
  then loaded and validated with `load_config` and `check_startup` (each env made once, the
  trackers and the model path checked), as the run does before any work; no run starts.
- any other `python -m MODULE ...` or `python SCRIPT.py ...`: `--help` in a subprocess (after
  the first positional argument, so a subcommand's own help), rc 0, and every `--option` the
  doc uses is in that help.
- `bash SCRIPT ...`: the script exists; where it passes its arguments on (`"$@"`), the
  options the doc uses are in the help of what it passes them to.

A `...` argument is the doc's placeholder for more of the same and is left out; `$PWD` is the
repository root. What cannot
be checked here is listed in NOT_CHECKED or CONFIG_ONLY with the reason; an entry that no
longer matches any command fails the test, so neither list outlives the docs.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# README.md and docs/ first; the examples', sandboxes' and data sets' READMEs too
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("examples/*/README.md")),
        *sorted(ROOT.glob("sandboxes/*.md")), *sorted(ROOT.glob("data/*/README.md"))]
PYTHONS = {"python", "python3", "python3.11", ".venv/bin/python"}
PROGRAMS = {"bash", "pip", "ray", "mlflow", "wandb"}  # the other programs the docs' commands start with

# Commands not checked, by a regular expression on the command's text: the reason.
NOT_CHECKED = {
    r"^python3(\.11)? -m venv ": "creates a virtual environment",
    r"^(\.venv/bin/|/work/venv-\w+/bin/)?pip (install|download)\b": "installs or downloads packages",
    r"^python3 -m pytest -rA ": "a SWE task's test command, run inside its sandbox",
    r"^ray (start|stop)\b": "starts or stops a Ray node (Ray's own command line)",
    r"^mlflow ui ": "MLflow's UI needs the full mlflow package, which no extra installs",
    r"^wandb sync ": "uploads a run to W&B (a network service)",
    r"^bash eval\.sh$": "a SWE-bench instance's eval script, run inside its sandbox",
}
# roll_agent.run commands whose config is loaded and validated but not `check_startup`ed: the reason.
CONFIG_ONLY = {
    r"ALFWORLD_DATA=|configs/alfworld\.yaml": "ALFWorld's env needs game data (ALFWORLD_DATA), which CI lacks",
    r"model\.path=/path/to/": "a placeholder model path",
}
# Wrappers that pass their arguments on ("$@"): what the doc's options must be in the help of.
FORWARDS = {
    "scripts/test.sh": ["-m", "pytest"],
    "benchmarks/gpu_check.sh": ["benchmarks/gpu_check.py"],
}


@dataclass
class Command:
    doc: str
    line: int
    text: str
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def _split(text: str) -> list[tuple[str, dict[str, str], list[str]]]:
    """`A=1 prog args && prog2 ...` -> [(text, env, argv), ...]; comments and `...` dropped."""
    tokens = shlex.split(text, comments=True)
    parts, current = [], []
    for tok in tokens + ["&&"]:
        if tok in ("&&", ";"):
            if current:
                parts.append(current)
            current = []
        else:
            current.append(tok)
    out = []
    for argv in parts:
        env = {}
        while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", argv[0]):
            key, _, value = argv.pop(0).partition("=")
            env[key] = value.replace("$PWD", str(ROOT))
        argv = [a for a in argv if a != "..."]
        if argv:
            out.append((" ".join(shlex.quote(a) for a in argv), env, argv))
    return out


def _looks_like_command(span: str) -> bool:
    """A line or span that starts with a program the docs run (after VAR=value assignments)."""
    words = re.sub(r"^([A-Z_][A-Z0-9_]*=\S*\s+)+", "", span.strip()).split()
    return len(words) > 1 and (words[0] in PYTHONS | PROGRAMS or words[0].endswith("/pip"))


def doc_commands() -> list[Command]:
    found = []
    for path in DOCS:
        rel = str(path.relative_to(ROOT))
        lines = path.read_text().splitlines()
        prose: list[tuple[int, str]] = []
        i = 0
        while i < len(lines):
            fence = re.match(r"^\s*(```+)\s*(\w*)\s*$", lines[i])
            if not fence:
                prose.append((i + 1, lines[i]))
                i += 1
                continue
            lang = fence.group(2)
            i += 1
            block: list[tuple[int, str]] = []
            while i < len(lines) and not re.match(r"^\s*" + fence.group(1) + r"\s*$", lines[i]):
                block.append((i + 1, lines[i].strip()))
                i += 1
            i += 1
            if lang not in ("", "bash", "sh", "shell", "console"):
                continue
            joined: list[tuple[int, str]] = []
            for n, text in block:
                if joined and joined[-1][1].endswith("\\"):
                    joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + text)
                else:
                    joined.append((n, text))
            for n, text in joined:
                if not text or text.startswith("#"):
                    continue
                if lang == "" and not _looks_like_command(text):
                    continue  # a diagram or a tree, not shell
                for cmd_text, env, argv in _split(text):
                    found.append(Command(rel, n, cmd_text, env, argv))
        # inline code spans in the prose (a span may run over a line break)
        text = "\n".join(t for _, t in prose)
        line_of = [n for n, t in prose for _ in range(len(t) + 1)]
        for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
            span = " ".join(m.group(1).split())
            if _looks_like_command(span):
                for cmd_text, env, argv in _split(span):
                    found.append(Command(rel, line_of[m.start()], cmd_text, env, argv))
    return found


COMMANDS = doc_commands()


def _reason(table: dict[str, str], cmd: Command) -> str | None:
    full = " ".join(f"{k}={v}" for k, v in cmd.env.items()) + " " + cmd.text
    return next((why for pattern, why in table.items() if re.search(pattern, cmd.text) or
                 re.search(pattern, full.strip())), None)


def _python_argv(cmd: Command) -> list[str] | None:
    """The arguments after the interpreter, for a python command."""
    return cmd.argv[1:] if cmd.argv[0] in PYTHONS else None


def _kind(cmd: Command) -> str:
    if _reason(NOT_CHECKED, cmd):
        return "not checked"
    args = _python_argv(cmd)
    if args is not None:
        if args[:2] == ["-m", "roll_agent.run"]:
            return "run"
        if args[:1] == ["-m"] and len(args) > 1 or args and args[0].endswith(".py"):
            return "help"
    if cmd.argv[0] == "bash" and len(cmd.argv) > 1:
        return "bash"
    return "unknown"


def test_docs_have_commands():
    kinds = [_kind(c) for c in COMMANDS]
    unknown = [str(c) for c, k in zip(COMMANDS, kinds) if k == "unknown"]
    assert not unknown, ("commands this test cannot check: add a checker, or an entry to NOT_CHECKED "
                         "with the reason:\n" + "\n".join(unknown))
    assert kinds.count("run") >= 10 and kinds.count("help") >= 10, kinds
    assert any(c.doc == "README.md" and c.text == "bash scripts/test.sh" for c in COMMANDS)


def test_allow_lists_are_used():
    """Every NOT_CHECKED and CONFIG_ONLY entry still matches a command of the docs."""
    for table in (NOT_CHECKED, CONFIG_ONLY):
        for pattern, why in table.items():
            assert any(_reason({pattern: why}, c) for c in COMMANDS), f"no doc command matches {pattern!r}: drop it"


RUN_COMMANDS = [c for c in COMMANDS if _kind(c) == "run"]


@pytest.mark.parametrize("cmd", RUN_COMMANDS, ids=[f"{c.doc}:{c.line}" for c in RUN_COMMANDS])
def test_run_command_config_is_valid(cmd: Command, monkeypatch):
    _help_runs()  # the --help subprocesses run meanwhile
    from roll_agent.config_loader import load_config
    from roll_agent.run import check_startup, parse_args

    monkeypatch.chdir(ROOT)
    for entry in reversed(cmd.env.get("PYTHONPATH", "").split(os.pathsep)):
        if entry:
            monkeypatch.syspath_prepend(str(ROOT / entry))
    args = parse_args(cmd.argv[3:])
    cfg = load_config(args.config, args.overrides)
    if _reason(CONFIG_ONLY, cmd) is None:
        check_startup(cfg)


def _help_argv(cmd: Command) -> tuple[list[str], dict[str, str]]:
    """What to run with `--help` for this command, and the environment's additions."""
    env = dict(cmd.env)
    if cmd.argv[0] == "bash":
        script = cmd.argv[1]
        return [sys.executable, *FORWARDS[script], "--help"], env
    args = _python_argv(cmd)
    target = args[:2] if args[0] == "-m" else args[:1]
    rest = args[len(target):]
    positional = next((a for a in rest if not a.startswith("-")), None)
    if target[0].endswith(".py"):  # a script run by path imports the repository's packages
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(ROOT)]))
    # the first positional argument before --help: a subcommand's own help, else the top level's
    if positional is not None and rest.index(positional) == 0:
        return [sys.executable, *target, positional, "--help"], env
    return [sys.executable, *target, "--help"], env


def _options(cmd: Command) -> set[str]:
    return {a.split("=", 1)[0] for a in cmd.argv if a.startswith("--") and a != "--help"}


HELP_COMMANDS = [c for c in COMMANDS if _kind(c) == "help" or _kind(c) == "bash" and c.argv[1] in FORWARDS]


def _run_help(key: tuple) -> subprocess.CompletedProcess:
    argv, env_items = key
    env = os.environ | {k: os.path.join(str(ROOT), v) if k == "PYTHONPATH" and not os.path.isabs(v) else v
                        for k, v in env_items}
    env.pop("ALFWORLD_DATA", None)
    return subprocess.run(list(argv), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def _help_targets() -> tuple[dict[tuple, list[Command]], list[str]]:
    """Each distinct `--help` to run, with the commands it checks; and the commands refused
    (a module or script that is not there, or has no argparse, where --help might run it)."""
    wanted: dict[tuple, list[Command]] = {}
    refused = []
    for cmd in HELP_COMMANDS:
        target = cmd.argv[2] if cmd.argv[1] == "-m" else cmd.argv[1]
        if not target.endswith(".sh"):
            source = ROOT / (target.replace(".", "/") + ".py" if cmd.argv[1] == "-m" else target)
            if not source.exists() and cmd.argv[1] == "-m":
                source = ROOT / target.replace(".", "/") / "__main__.py"
            if not source.exists() or "argparse" not in source.read_text():
                refused.append(f"{cmd}: {source.relative_to(ROOT)} is missing or has no argparse (--help may run it)")
                continue
        argv, env = _help_argv(cmd)
        wanted.setdefault((tuple(argv), tuple(sorted(env.items()))), []).append(cmd)
    return wanted, refused


@functools.cache
def _help_runs() -> dict[tuple, Future]:
    """The `--help` subprocesses, started once by the first test that needs them, so that they
    run beside the in-process config checks."""
    pool = ThreadPoolExecutor(max_workers=3)
    runs = {key: pool.submit(_run_help, key) for key in _help_targets()[0]}
    pool.shutdown(wait=False)
    return runs


def test_help_level_commands():
    """`--help` of every module and script the docs run (each distinct one once, in parallel)."""
    wanted, problems = _help_targets()
    runs = _help_runs()
    for key, cmds in wanted.items():
        res = runs[key].result()
        if res.returncode != 0:
            problems.append(f"{cmds[0]}\n  `{' '.join(key[0][1:])}` exited {res.returncode}: {res.stderr[-500:]}")
            continue
        for cmd in cmds:
            missing = sorted(o for o in _options(cmd) if not re.search(re.escape(o) + r"(?![\w-])", res.stdout))
            if missing:
                problems.append(f"{cmd}\n  options not in `{' '.join(key[0][1:])}`: {missing}")
    assert not problems, "\n".join(problems)


def test_bash_scripts_exist():
    for cmd in (c for c in COMMANDS if _kind(c) == "bash"):
        script = ROOT / cmd.argv[1]
        assert script.is_file(), f"{cmd}: no {script}"
        passes_on = '"$@"' in script.read_text()
        assert not _options(cmd) or passes_on, f"{cmd}: the script takes no arguments"
        assert not passes_on or cmd.argv[1] in FORWARDS, \
            f"{cmd}: name in FORWARDS what {cmd.argv[1]} passes its arguments to"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_fence = False
    for line in path.read_text().splitlines():
        if re.match(r"^\s*```", line):
            in_fence = not in_fence
        m = None if in_fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_relative_links_resolve():
    """Every relative link of README.md, docs/ and the other READMEs names a file that exists,
    and its #anchor a heading of that file."""
    problems = []
    for doc in DOCS:
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        text = re.sub(r"`[^`\n]*`", "", text)  # code spans hold no links (and may hold brackets)
        for m in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)\)", text):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto
            path_part, _, anchor = target.partition("#")
            dest = (doc.parent / path_part).resolve() if path_part else doc
            where = f"{doc.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                problems.append(f"{where}: no such file")
            elif not str(dest).startswith(str(ROOT)):
                problems.append(f"{where}: outside the repository")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                problems.append(f"{where}: no heading with that anchor in {dest.relative_to(ROOT)}")
    assert not problems, "\n".join(problems)
