"""A tool-use env: arithmetic word problems solved with a calculator tool.

Actions are tool calls in the Hermes / Qwen chat-template convention,
`<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>`,
with plain-text fallbacks (`calculate: 12*34`, `answer: 408`). The final answer is
`<answer>408</answer>` (or `answer: 408`); reward 1 when it is right. The tool's JSON
schema is in `info["tools"]` for templates that render tools themselves.
"""

from __future__ import annotations

import ast
import asyncio
import itertools
import json
import operator
import random
import re
import string
import time

import gymnasium

TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / // % and parentheses.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
INSTRUCTIONS = (
    "Solve the arithmetic problem. You may call the calculator tool: "
    '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call> '
    "(or write: calculate: 12*34). When you know the result, answer with <answer>NUMBER</answer> "
    "(or write: answer: NUMBER). One tool call or one answer per turn."
)
ACTION_TAIL = 2000  # only the end of a long output is parsed: the model's last words decide
TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
PLAIN_CALL = re.compile(r"calculate\s*:\s*([-+*/%() 0-9.]{1,200})", re.IGNORECASE)
ANSWER = re.compile(r"<answer>\s*(-?\d{1,12})\s*</answer>|answer\s*:\s*(-?\d{1,12})", re.IGNORECASE)
_instances = itertools.count()
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
       ast.Mod: operator.mod, ast.Div: operator.truediv, ast.USub: operator.neg, ast.UAdd: operator.pos}


def evaluate(expression: str) -> float | int:
    """Arithmetic only: numbers, + - * / // % and parentheses (no names, no calls, no powers)."""
    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
            return OPS[type(node.op)](walk(node.operand))
        raise ValueError("only numbers, + - * / // % and parentheses are allowed")

    if len(expression) > 200:
        raise ValueError("expression too long")
    return walk(ast.parse(expression, mode="eval"))


class CalculatorEnv(gymnasium.Env):
    metadata = {"render_modes": []}

    def __init__(self, max_steps: int = 6, invalid_action_penalty: float = 0.0):
        self.max_steps = max_steps
        self.invalid_action_penalty = invalid_action_penalty
        self.observation_space = gymnasium.spaces.Text(4096, charset=string.printable)
        self.action_space = gymnasium.spaces.Text(10_000, charset=string.printable)
        self._expression, self._answer = "0", 0
        self._steps, self._last_result = 0, None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        a, b = (int(x) for x in self.np_random.integers(11, 99, size=2))
        c = int(self.np_random.integers(100, 999))
        self._expression = f"{a}*{b}+{c}"
        self._answer = a * b + c
        self._steps, self._last_result = 0, None
        info = {"instructions": INSTRUCTIONS, "tools": [TOOL_SCHEMA], "success": False, "invalid_action": False}
        return f"Problem: compute {self._expression}", info

    def step(self, action: str):
        self._steps += 1
        text = str(action)[-ACTION_TAIL:]
        truncated = self._steps >= self.max_steps
        answer = ANSWER.search(text)
        if answer:
            correct = int(answer.group(1) or answer.group(2)) == self._answer
            obs = "Correct." if correct else "Wrong answer."
            return obs, float(correct), True, False, self._info(correct, False)
        expression = self._tool_expression(text)
        if expression is None:
            obs = "Invalid action. Call the calculator or give <answer>NUMBER</answer>."
            return obs, self.invalid_action_penalty, False, truncated, self._info(False, True)
        try:
            result = evaluate(expression)
            self._last_result = int(result) if float(result).is_integer() else result
            obs = f"calculator result: {self._last_result}"
        except (ValueError, SyntaxError, ZeroDivisionError, OverflowError) as exc:
            obs = f"calculator error: {exc}"
        return obs, 0.0, False, truncated, self._info(False, False)

    @staticmethod
    def _tool_expression(text: str) -> str | None:
        call = TOOL_CALL.search(text)
        if call:
            try:
                payload = json.loads(call.group(1))
                if payload.get("name") == "calculator":
                    return str(payload.get("arguments", {}).get("expression", ""))
            except (json.JSONDecodeError, AttributeError):
                return None
            return None
        plain = PLAIN_CALL.search(text)
        return plain.group(1).strip() if plain else None

    def _info(self, success: bool, invalid: bool) -> dict:
        return {"success": success, "invalid_action": invalid, "tools": [TOOL_SCHEMA]}

    def expert_action(self) -> str:
        if self._last_result is None:
            return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{self._expression}"}}}}</tool_call>'
        return f"<answer>{self._last_result}</answer>"



# The calculator as a chat agent's tool: the JSON schema transformers' `get_json_schema`
# makes from a documented `calculator(expression: str) -> str` (trainers that take tools as
# Python functions render exactly this), so every framework prompts the model the same way.
LATENCY_TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / // % and parentheses.",
        "parameters": {"type": "object",
                       "properties": {"expression": {"type": "string", "description": "The expression, e.g. 12*34+56."}},
                       "required": ["expression"]},
        "return": {"type": "string", "description": "The result, or an error message."},
    },
}
TOOL_INSTRUCTIONS = ("Solve the arithmetic problem. Call the calculator tool when you need it. "
                     "When you know the result, reply with <answer>NUMBER</answer>.")


def tool_latency(rng: random.Random, min_s: float, mean_s: float, max_s: float) -> float:
    """Long-tailed tool latency: `min_s` plus an exponential of mean `mean_s - min_s`, capped at `max_s`."""
    if mean_s <= min_s:
        return min_s
    return min(max_s, min_s + rng.expovariate(1.0 / (mean_s - min_s)))


class ToolLatencyCalculatorEnv(CalculatorEnv):
    """The calculator in a chat agent's loop, with a slow tool.

    A turn with a `<tool_call>` gets the tool's result, after a long-tailed latency, as a
    `<tool_response>` turn (how tool-calling chat templates render a tool message); a turn
    without one is the final answer and ends the episode (reward 1 when it is right). A
    tool call on the last allowed turn truncates the episode. `astep` waits on the event
    loop, `step` blocks its thread.
    """

    metadata = {"render_modes": [], "free_text_actions": True}

    def __init__(self, max_steps: int = 3, max_operand: int = 9, latency_min_s: float = 0.1,
                 latency_mean_s: float = 0.2, latency_max_s: float = 0.5):
        super().__init__(max_steps=max_steps)
        if not 0 <= latency_min_s <= latency_max_s:
            raise ValueError(f"need 0 <= latency_min_s <= latency_max_s, got {latency_min_s}, {latency_max_s}")
        if max_operand < 2:
            raise ValueError(f"max_operand must be >= 2, got {max_operand}")
        self.max_operand = max_operand
        self.latency = (latency_min_s, latency_mean_s, latency_max_s)
        self._latency_rng = random.Random(next(_instances))  # latency varies per instance, not per task

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        gymnasium.Env.reset(self, seed=seed)
        a, b, c = (int(x) for x in self.np_random.integers(2, self.max_operand + 1, size=3))
        self._expression, self._answer = f"{a}*{b}+{c}", a * b + c
        self._steps, self._last_result = 0, None
        info = {"instructions": TOOL_INSTRUCTIONS, "tools": [LATENCY_TOOL_SCHEMA], "success": False,
                "invalid_action": False}
        return f"Problem: compute {self._expression}", info

    def call_tool(self, expression: str) -> str:
        """The tool's answer (without the wait), as a tool message's content."""
        try:
            result = evaluate(expression)
            self._last_result = int(result) if float(result).is_integer() else result
            return f"calculator result: {self._last_result}"
        except (ValueError, SyntaxError, ZeroDivisionError, OverflowError) as exc:
            return f"calculator error: {exc}"

    def answer_reward(self, text: str) -> float:
        answer = ANSWER.search(str(text)[-ACTION_TAIL:])
        return float(bool(answer) and int(answer.group(1) or answer.group(2)) == self._answer)

    def sample_latency(self) -> float:
        return tool_latency(self._latency_rng, *self.latency)

    def step(self, action: str):
        expression = self._plan(action)
        if expression is not None:
            time.sleep(self.sample_latency())
        return self._advance(action, expression)

    async def astep(self, action: str):
        expression = self._plan(action)
        if expression is not None:
            await asyncio.sleep(self.sample_latency())
        return self._advance(action, expression)

    def _plan(self, action: str) -> str | None:
        self._steps += 1
        call = TOOL_CALL.search(str(action)[-ACTION_TAIL:])
        if call is None:
            return None
        try:
            payload = json.loads(call.group(1))
            return str(payload["arguments"]["expression"]) if payload.get("name") == "calculator" else None
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError):
            return None

    def _advance(self, action: str, expression: str | None):
        if expression is None:
            reward = self.answer_reward(action)
            return ("Correct." if reward else "Wrong answer."), reward, True, False, self._info(bool(reward), False)
        obs = f"<tool_response>\n{self.call_tool(expression)}\n</tool_response>"
        return obs, 0.0, False, self._steps >= self.max_steps, self._info(False, False)

    def expert_action(self) -> str:
        if self._last_result is None:
            call = json.dumps({"name": "calculator", "arguments": {"expression": self._expression}})
            return f"<tool_call>\n{call}\n</tool_call>"
        return f"<answer>{self._last_result}</answer>"
