"""A command-line agent as a user would write one: reads the task from stdin, calls the model
with the plain openai SDK through OPENAI_BASE_URL / OPENAI_API_KEY, prints its answer.
`mode` in the task makes it misbehave: crash (exit 3), hang, or never call the model."""

import json
import sys
import time

from openai import OpenAI

task = json.load(sys.stdin)
mode = task.get("mode", "")
if mode == "crash":
    print("something went wrong in the agent", file=sys.stderr)
    sys.exit(3)
if mode == "hang":
    time.sleep(3600)
if mode != "silent":
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["question"]}])
    print(reply.choices[0].message.content)
