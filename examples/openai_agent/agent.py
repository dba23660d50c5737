"""A user's agent, written with the plain `openai` SDK and one tool: it answers arithmetic
questions, calling a calculator when it wants to. Nothing in it knows about roll_agent: the same
function runs against OpenAI (`solve(task, AsyncOpenAI())`) or is trained by roll_agent, which
hands it a client whose base URL and key are the episode's session.

    PYTHONPATH=examples/openai_agent python -m roll_agent.run --config examples/openai_agent/config.yaml
"""

from __future__ import annotations

import ast
import json
import operator

from openai import AsyncOpenAI

TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}]
SYSTEM = ("Answer the arithmetic question. You may call the calculator tool. "
          "End with the final answer as a number.")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg}


def calculator(expression: str) -> str:
    def walk(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.operand))
        raise ValueError("not arithmetic")
    try:
        value = walk(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as exc:
        return f"error: {exc}"
    return str(int(value) if float(value).is_integer() else round(value, 6))


async def solve(task: dict, client: AsyncOpenAI, model: str = "gpt-4o-mini", max_turns: int = 4) -> str:
    """The agent loop: ask, run any tool calls, ask again; returns the final answer text."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}]
    answer = ""
    for _ in range(max_turns):
        reply = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        answer = message.content or ""
        if not message.tool_calls:
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculator(str(expression))})
    return answer


def score(task: dict, answer: str) -> float:
    """1 when the last number in the answer is the task's."""
    numbers = [w.strip(".,") for w in str(answer).replace("=", " ").split()]
    numbers = [n for n in numbers if n.lstrip("-").replace(".", "", 1).isdigit()]
    return float(bool(numbers) and float(numbers[-1]) == float(task["answer"]))
