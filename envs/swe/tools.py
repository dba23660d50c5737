"""The SWE agent's tools: parsing a model's tool call and running it in a sandbox.

Tool calls use the Hermes / Qwen2.5 chat-template convention shared with the
calculator env (`envs.tool_use.TOOL_CALL`):
`<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>`.
A model that writes a fenced shell block instead (```bash ... ```) gets it run as a
bash call. Anything else - garbage, an unterminated or non-JSON call, an unknown tool
or argument - becomes a `ToolCallError` whose message is shown to the model as the
observation; nothing the model writes can raise out of an episode.

Tools: `bash`, `str_replace_editor` (view / create / str_replace / insert) and
`submit`. Every output is cut to `max_output_chars` (head + tail, with a note).
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from envs.tool_use import TOOL_CALL

MAX_ACTION_CHARS = 200_000  # a longer response is a runaway generation, not a tool call
FENCE = re.compile(r"```[ \t]*(bash|sh|shell|console)?[ \t]*\n(.*?)```", re.DOTALL)
EDITOR_COMMANDS = ("view", "create", "str_replace", "insert")

TOOL_SCHEMAS: list[dict] = [
    {"type": "function", "function": {
        "name": "bash",
        "description": "Run a bash command in the repository (cwd: the repo root). No network. "
                       "Long outputs are truncated; use head/grep/sed -n to look at parts.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "str_replace_editor",
        "description": "View, create and edit files. view: a file with line numbers (view_range [start, end], "
                       "end -1 = to the end) or a directory listing. create: write file_text to path. "
                       "str_replace: replace old_str, which must occur exactly once, with new_str. "
                       "insert: insert new_str after line insert_line (0 = at the top).",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "enum": list(EDITOR_COMMANDS)},
            "path": {"type": "string"},
            "view_range": {"type": "array", "items": {"type": "integer"}},
            "file_text": {"type": "string"},
            "old_str": {"type": "string"},
            "new_str": {"type": "string"},
            "insert_line": {"type": "integer"}},
            "required": ["command", "path"]}}},
    {"type": "function", "function": {
        "name": "submit",
        "description": "Finish: your changes to the repository (git diff) are submitted and graded.",
        "parameters": {"type": "object", "properties": {}}}},
]
_ARGUMENTS = {
    "bash": ({"command"}, {"command"}),
    "str_replace_editor": ({"command", "path"},
                           {"command", "path", "view_range", "file_text", "old_str", "new_str", "insert_line"}),
    "submit": (set(), set()),
}


class ToolCallError(ValueError):
    """The model's output is not a usable tool call; the message tells it how to fix that."""


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    note: str = ""  # said to the model with the result (e.g. extra calls ignored)


def describe_tools() -> str:
    """The tool section of the system prompt (templates here do not render `tools` themselves)."""
    lines = ["You can call these tools, one per turn, as <tool_call>JSON</tool_call>:"]
    for schema in TOOL_SCHEMAS:
        fn = schema["function"]
        lines.append(f"- {fn['name']}({', '.join(fn['parameters']['properties'])}): {fn['description']}")
    lines += [
        'Example: <tool_call>{"name": "bash", "arguments": {"command": "grep -rn \\"def main\\" ."}}</tool_call>',
        'Example: <tool_call>{"name": "str_replace_editor", "arguments": {"command": "str_replace", '
        '"path": "pkg/mod.py", "old_str": "x < 1", "new_str": "x <= 1"}}</tool_call>',
        "A fenced ```bash block is also run as a bash command.",
        'When the fix is done, call <tool_call>{"name": "submit", "arguments": {}}</tool_call>.',
    ]
    return "\n".join(lines)


def parse_action(text: str) -> ToolCall:
    """The tool call in a model response; raises ToolCallError (message for the model) otherwise."""
    if not isinstance(text, str):
        raise ToolCallError(f"expected text, got {type(text).__name__}")
    if len(text) > MAX_ACTION_CHARS:
        raise ToolCallError(f"response of {len(text)} characters is too long (limit {MAX_ACTION_CHARS}); "
                            "send one short tool call")
    if "<tool_call>" in text:
        return _parse_tagged(text)
    fenced = FENCE.search(text)
    if fenced and fenced.group(2).strip():
        return _checked(ToolCall("bash", {"command": fenced.group(2).strip()}))
    raise ToolCallError('no tool call found. Call a tool: <tool_call>{"name": "bash", "arguments": '
                        '{"command": "ls"}}</tool_call>, or submit with <tool_call>{"name": "submit", '
                        '"arguments": {}}</tool_call>')


def _parse_tagged(text: str) -> ToolCall:
    calls = TOOL_CALL.findall(text)
    if not calls and "</tool_call>" in text:
        raise ToolCallError('a tool call is a JSON object: <tool_call>{"name": TOOL, "arguments": {...}}</tool_call>')
    if not calls:
        raise ToolCallError("unterminated <tool_call>: close it, <tool_call>{...JSON...}</tool_call>")
    try:
        payload = json.loads(calls[0])
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ToolCallError(f"the tool call is not valid JSON ({exc}); escape newlines and quotes "
                            "inside strings as \\n and \\\"") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        raise ToolCallError('a tool call is a JSON object {"name": TOOL, "arguments": {...}}')
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):  # some templates JSON-encode the arguments a second time
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            raise ToolCallError('"arguments" must be a JSON object') from None
    if not isinstance(arguments, dict):
        raise ToolCallError('"arguments" must be a JSON object')
    note = f"only the first of {len(calls)} tool calls was run (one per turn)" if len(calls) > 1 else ""
    return _checked(ToolCall(payload["name"], arguments, note))


def _checked(call: ToolCall) -> ToolCall:
    if call.name not in _ARGUMENTS:
        raise ToolCallError(f"unknown tool {call.name!r}; tools: {', '.join(_ARGUMENTS)}")
    required, allowed = _ARGUMENTS[call.name]
    missing, extra = required - set(call.arguments), set(call.arguments) - allowed
    if missing:
        raise ToolCallError(f"{call.name} needs argument(s) {', '.join(sorted(missing))}")
    if extra:
        raise ToolCallError(f"{call.name} has no argument(s) {', '.join(sorted(extra))}; "
                            f"valid: {', '.join(sorted(allowed)) or 'none'}")
    for key, value in call.arguments.items():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ToolCallError(f"argument {key} contains invalid unicode (a lone surrogate)") from None
    for key in ("command", "path"):
        if key in call.arguments and not isinstance(call.arguments[key], str):
            raise ToolCallError(f"{call.name} argument {key} must be a string")
    if call.name == "str_replace_editor" and call.arguments["command"] not in EDITOR_COMMANDS:
        raise ToolCallError(f"str_replace_editor command must be one of {', '.join(EDITOR_COMMANDS)}, "
                            f"got {call.arguments['command']!r}")
    return call


def truncate(text: str, limit: int) -> str:
    """Head and tail of `text` within `limit` characters, with a note saying what was cut."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit // 2], text[len(text) - (limit - limit // 2):]
    return (f"{head}\n[... {len(text) - len(head) - len(tail)} characters truncated; "
            f"narrow the command (grep, head, sed -n, view_range) to see them ...]\n{tail}")


@dataclass
class ToolsConfig:
    """How tools run in the sandbox (the env's `tools` kwarg)."""

    command_timeout_s: float = 60.0
    max_output_chars: int = 8000  # what the model sees of one output
    max_view_lines: int = 400  # a view without a range shows at most this many lines

    def __post_init__(self) -> None:
        if self.command_timeout_s <= 0 or self.max_output_chars < 200 or self.max_view_lines <= 0:
            raise ValueError("tools: command_timeout_s > 0, max_output_chars >= 200 and max_view_lines > 0 "
                             f"are required, got {self}")


class Tools:
    """Runs parsed tool calls in a started sandbox whose work dir is the repository.

    Sandbox failures (SandboxError) propagate: the sandbox is gone and the episode
    with it. Mistakes in a call (missing file, ambiguous old_str) are observations.
    """

    def __init__(self, sandbox, workdir: str, cfg: ToolsConfig | None = None):
        self.sandbox = sandbox
        self.workdir = workdir
        self.cfg = cfg or ToolsConfig()

    def run(self, call: ToolCall) -> str:
        if call.name == "bash":
            out = self.bash(call.arguments["command"])
        elif call.name == "str_replace_editor":
            try:
                out = self.edit(call.arguments)
            except ToolCallError as exc:
                out = f"Error: {exc}"
        else:
            raise ValueError("submit is handled by the env, not run as a tool")
        out = truncate(out, self.cfg.max_output_chars)
        return f"{out}\n[note: {call.note}]" if call.note else out

    def bash(self, command: str) -> str:
        r = self.sandbox.exec(command, timeout=self.cfg.command_timeout_s, workdir=self.workdir)
        if r.timed_out:
            return f"{r.output}\n[command timed out after {self.cfg.command_timeout_s:.0f}s and was killed]"
        return f"{r.output}\n[exit code {r.exit_code}]" if r.exit_code else (r.output or "[no output]")

    def edit(self, args: dict[str, Any]) -> str:
        path = posixpath.normpath(posixpath.join(self.workdir, args["path"]))
        command = args["command"]
        if command == "view":
            return self._view(path, args.get("view_range"))
        if command == "create":
            text = _string(args, "file_text")
            self._exec_checked(f"mkdir -p -- {shlex.quote(posixpath.dirname(path))}")
            self.sandbox.write_file(path, text)
            return f"File created: {path} ({len(text.splitlines())} lines)"
        content = self._read(path)
        if command == "str_replace":
            new_str = args.get("new_str", "")
            if not isinstance(new_str, str):
                raise ToolCallError("str_replace_editor str_replace needs new_str as a string (\"\" to delete)")
            new = _replace_once(content, _string(args, "old_str"), new_str, path)
        else:
            new = _insert(content, args.get("insert_line"), _string(args, "new_str"))
        self.sandbox.write_file(path, new)
        return f"Edited {path}. The changed region now reads:\n{_changed_region(content, new)}"

    def _view(self, path: str, view_range: Any) -> str:
        r = self.sandbox.exec(f"test -d {shlex.quote(path)}", workdir=self.workdir)
        if r.exit_code == 0:
            listing = self._exec_checked(f"find {shlex.quote(path)} -maxdepth 2 -not -path '*/.git*' | sort")
            return f"Files under {path} (2 levels):\n{listing}"
        lines = self._read(path).splitlines()
        start, end = _range(view_range, len(lines), self.cfg.max_view_lines)
        shown = "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(lines[start - 1:end], start))
        more = f"\n[lines {end + 1}-{len(lines)} not shown; use view_range]" if end < len(lines) else ""
        return f"{path} (lines {start}-{end} of {len(lines)}):\n{shown}{more}"

    def _read(self, path: str) -> str:
        r = self.sandbox.exec(f"test -f {shlex.quote(path)}", workdir=self.workdir)
        if r.exit_code != 0:
            raise ToolCallError(f"{path} is not an existing file; create it with command=create, "
                                "or find the right path with view on a directory")
        return self.sandbox.read_file(path)

    def _exec_checked(self, command: str) -> str:
        r = self.sandbox.exec(command, timeout=self.cfg.command_timeout_s, workdir=self.workdir)
        if r.exit_code != 0:
            raise ToolCallError(r.output.strip() or f"`{command}` failed with exit code {r.exit_code}")
        return r.output


def _string(args: dict, key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str):
        raise ToolCallError(f"str_replace_editor {args['command']} needs {key} as a string")
    return value


def _range(view_range: Any, n: int, max_lines: int) -> tuple[int, int]:
    if view_range is None:
        return 1, min(n, max_lines)
    if (not isinstance(view_range, list) or len(view_range) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in view_range)):
        raise ToolCallError("view_range must be [start, end] (integers; end -1 = to the end)")
    start, end = view_range
    end = n if end == -1 else end
    if not 1 <= start <= max(n, 1) or end < start:
        raise ToolCallError(f"view_range {view_range} is outside the file's lines 1-{n}")
    return start, min(end, n)


def _replace_once(content: str, old: str, new: str, path: str) -> str:
    if not old:
        raise ToolCallError("old_str must not be empty; to add text use command=insert")
    count = content.count(old)
    if count == 0:
        raise ToolCallError(f"old_str was not found in {path}; view the file and copy the text exactly "
                            "(whitespace and indentation matter)")
    if count > 1:
        at, lines = -1, []
        for _ in range(min(count, 10)):
            at = content.index(old, at + 1)
            lines.append(str(content.count("\n", 0, at) + 1))
        raise ToolCallError(f"old_str occurs {count} times in {path} (lines {', '.join(lines)}); "
                            "include more surrounding lines so that it is unique")
    return content.replace(old, new, 1)


def _insert(content: str, insert_line: Any, text: str) -> str:
    lines = content.splitlines(keepends=True)
    if not isinstance(insert_line, int) or isinstance(insert_line, bool) or not 0 <= insert_line <= len(lines):
        raise ToolCallError(f"insert_line must be an integer from 0 to {len(lines)} (the file's line count)")
    if lines and not lines[-1].endswith("\n") and insert_line == len(lines):
        lines[-1] += "\n"
    block = text if text.endswith("\n") else text + "\n"
    return "".join(lines[:insert_line]) + block + "".join(lines[insert_line:])


def _changed_region(old: str, new: str, context: int = 3) -> str:
    """Numbered lines around the first difference, so the model sees its edit in place."""
    a, b = old.splitlines(), new.splitlines()
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    tail = 0
    while tail < min(len(a), len(b)) - first and a[len(a) - 1 - tail] == b[len(b) - 1 - tail]:
        tail += 1
    lo, hi = max(first - context, 0), min(len(b) - tail + context, len(b))
    return "\n".join(f"{i + 1:6d}\t{b[i]}" for i in range(lo, hi))
