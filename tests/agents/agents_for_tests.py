"""Agents the tests run as `tests.agents.agents_for_tests:NAME` (importable from the repository root)."""

from __future__ import annotations


async def editing_agent(task: dict, client) -> float:
    """Three calls; the third drops the first exchange (a history-editing agent: a fork)."""
    history = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": task["question"]}]
    for follow_up in ("Are you sure?", "Say it once more."):
        reply = await client.chat.completions.create(model="m", messages=history, max_tokens=6)
        history += [{"role": "assistant", "content": reply.choices[0].message.content},
                    {"role": "user", "content": follow_up}]
    await client.chat.completions.create(model="m", messages=[history[0]] + history[3:], max_tokens=6)
    return float(task["id"] % 2)
