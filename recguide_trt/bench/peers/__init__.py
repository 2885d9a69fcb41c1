"""The project's peer benchmark: the embedded model in other engines, side by side with ours.

Layout (one job per module):

- :mod:`.convert`   the embedded NLD checkpoint -> a Llama HF checkpoint (and a GGUF for llama.cpp)
- :mod:`.adapters`  one adapter per engine, all with the same ``serial`` / ``batch`` calls
- :mod:`.worker`    the long-lived worker process an adapter runs in (inside that engine's venv)
- :mod:`.client`    starts workers and talks to them (JSON lines over pipes)
- :mod:`.rows`      which rows the table has: our backends x policies, ``LLM()``'s default, the peers
- :mod:`.run`       warm-up, interleaved rounds, the greedy reference
- :mod:`.report`    the Markdown table, ratios and equality counts from a results dict
- :mod:`.machine`   the machine record written next to the results
- :mod:`.near_ties` our logit margin at each greedy divergence

Modules that run inside a peer's venv (``worker``, ``adapters``, ``convert``) import only the
standard library at module level: the peer venvs do not have this package's dependencies, and
the worker loads this directory under its own name there (see :mod:`.worker`).
"""
