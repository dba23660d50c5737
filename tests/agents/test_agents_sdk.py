"""The OpenAI Agents SDK, unchanged, against the endpoint: an Agent with a function tool runs to
its final output, and its calls are recorded as one token-exact segment."""

import openai

from tests.agents.conftest import answering, session_of, stack_for, tool_then_answer
from tests.conftest import run


def test_an_agents_sdk_agent_with_a_function_tool_runs_against_the_endpoint(formatter):
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # the SDK would export traces to OpenAI otherwise
    used = []

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        used.append((a, b))
        return a + b

    stack = stack_for(formatter, answering(formatter, tool_then_answer))

    async def go():
        async with session_of(stack) as (session, url):
            client = openai.AsyncOpenAI(base_url=url, api_key="session-in-url")
            model = OpenAIChatCompletionsModel(model="roll_agent", openai_client=client)
            agent = Agent(name="adder", instructions="Add the numbers with the tool.", tools=[add], model=model)
            result = await Runner.run(agent, "What is 1 + 2?")
            await client.close()
            return result.final_output, session

    output, session = run(go())
    assert used == [(1, 2)]
    assert output == "The sum is 3."
    assert session.calls == 2
    # the SDK re-sends the history as it was answered: the second call extended the first
    assert (len(session.segments), session.extended) == (1, 1), (len(session.segments), session.forked)
