"""Sandboxed tools in the SDK's Messages tool runner, offline against stockade's emulator.

Run: `.venv/bin/python scripts/messages_example.py` (add `--stream` to stream each turn).

The emulator plays a model that calls `word_count`, then a tool that hangs, then answers. Both tools run
in stockade workers: the hang is killed at its 2 s timeout and the model sees an `is_error` result, while
the loop itself is the SDK's own, unchanged.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from anthropic import Anthropic
from stockade.emulator.messages import MessagesScript
from stockade.emulator.server import Emulator
from stockade.sandbox.policy import ResourcePolicy
from stockade.supervisor import sandboxed

HANG_TIMEOUT_S = 2.0

SCRIPT = """
[[turns]]
[[turns.content]]
type = "text"
text = "Let me count the words first."
[[turns.content]]
type = "tool_use"
name = "word_count"
input = { text = "the quick brown fox jumps over the lazy dog" }

[[turns]]
[[turns.content]]
type = "tool_use"
name = "hang"
input = { reason = "a stuck network call" }

[[turns]]
stop_reason = "end_turn"
[[turns.content]]
type = "text"
text = "The text has 9 words; the second tool timed out."
"""


def main() -> None:
    """Run the scripted conversation and print each turn and the tool results the runner sent."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream", action="store_true", help="use stream=True")
    args = parser.parse_args()
    policies = {"hang": ResourcePolicy(wall_timeout_s=HANG_TIMEOUT_S)}
    refs = ["stockade.tools.demo:word_count", "stockade.tools.demo:hang"]
    with Emulator() as emulator, sandboxed(refs, policies=policies) as tools:
        state = emulator.add_messages_script(MessagesScript.from_toml(SCRIPT))
        client = Anthropic(base_url=emulator.base_url, api_key="offline")
        runner = client.beta.messages.tool_runner(
            model="claude-emulated",
            max_tokens=1024,
            tools=tools,
            messages=[{"role": "user", "content": "How many words are in the pangram?"}],
            stream=args.stream,
        )
        for item in runner:
            message = item.get_final_message() if args.stream else item
            print(f"assistant ({message.stop_reason}):", _describe(message.to_dict()["content"]))
    for conversation in state.conversations[1:]:
        for block in conversation[-1]["content"]:
            print("tool_result:", json.dumps(block))


def _describe(content: list[dict[str, Any]]) -> str:
    return " | ".join(b["text"] if b["type"] == "text" else f"{b['name']}({b['input']})" for b in content)


if __name__ == "__main__":
    main()
