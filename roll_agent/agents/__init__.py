"""Train agents people already have, unchanged: an OpenAI-compatible endpoint in front of the
LLMProxy (server.py), sessions that record every call token-exactly (sessions.py) and reuse
the model's answers found in an agent's history (token_reuse.py), answers streamed as they are
sampled (streaming.py), the request/response shapes of the OpenAI API and the tool-call parsers
(openai_api.py), and
agent episodes: a user's agent function or command played as one episode of an env
(runner.py, task_env.py). docs/architecture.md, section "Agents through the endpoint".
"""
