"""roll_agent: agentic RL with an LLMProxy, env-level async and a bounded-staleness buffer."""

import os
import sys

# OpenMP (torch's intra-op pool on CPU) reads its wait policy once, when torch loads it. Its default
# keeps idle threads spinning for a while after each parallel region; in a local run the engine's
# process and the trainer's compute side by side, and each one's spinning threads take the cores
# the other needs. Sleeping threads let both use every core (runtime/local.py: process_threads;
# measured in docs/performance.md). A user's OMP_WAIT_POLICY wins; torch already loaded: too late.
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
