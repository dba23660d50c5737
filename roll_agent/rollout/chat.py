"""Token-in/token-out chat framing for multi-turn episodes.

Model tokens are never re-tokenized: after the first prompt, each env observation is
appended as the token ids of the text the chat template puts between the end of an
assistant turn and the start of the next one. That text is found once per tokenizer
by rendering the template around placeholders.
"""

from __future__ import annotations

_ASSISTANT = "\x00ASSISTANT\x00"
_OBS = "\x00OBSERVATION\x00"


class ChatFormatter:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "The tokenizer has no chat template; give the model a chat template "
                "(tokenizer.chat_template) or use an instruct checkpoint."
            )
        # The first prompt (rendered with the generation prompt), then what the model samples, then
        # the text between turns, must be how the template renders the two-turn conversation: the
        # answer's text right after the first prompt. (An assistant turn rendered *last* may differ,
        # as Qwen3's gains an empty <think> block there; an episode never renders one last.)
        base = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        first = self._render(base, True)
        two = self._render(
            base + [{"role": "assistant", "content": _ASSISTANT}, {"role": "user", "content": _OBS}], True
        )
        cut = len(first) + len(_ASSISTANT)
        if two[:cut] != first + _ASSISTANT or _OBS not in two[cut:]:
            raise ValueError("This chat template re-renders earlier turns (the first prompt followed by the answer "
                             "is not how it renders the conversation); multi-turn token-in/token-out needs a "
                             "prefix-stable template.")
        self._between = two[cut:]  # e.g. "<|im_end|>\n<|im_start|>user\n{OBS}<|im_end|>\n<|im_start|>assistant\n"
        self.stop_token_ids = self._stop_ids()
        self._stop_texts = {tokenizer.decode([i]): i for i in self.stop_token_ids}
        # the token the template itself ends an assistant turn with (used to write demonstrations)
        # the Rust tokenizer directly: the transformers wrapper costs ~25 us a call on the hot path
        self._fast = getattr(tokenizer, "backend_tokenizer", None)
        self.end_of_turn_id = next((i for text, i in self._stop_texts.items() if self._between.startswith(text)),
                                   self.stop_token_ids[0] if self.stop_token_ids else None)

    def _render(self, messages, add_generation_prompt: bool, tools: list | None = None) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def _stop_ids(self) -> tuple[int, ...]:
        ids = set()
        eos = self.tokenizer.eos_token_id
        if eos is not None:
            ids.add(eos)
        for token in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
            tid = self.tokenizer.convert_tokens_to_ids(token)
            if isinstance(tid, int) and tid != self.tokenizer.unk_token_id and tid is not None and tid >= 0:
                ids.add(tid)
        return tuple(sorted(ids))

    def first_prompt(self, instructions: str, observation: str, tools: list | None = None) -> list[int]:
        """`tools`: the env's JSON tool schemas (`info["tools"]`), rendered by templates that support them."""
        messages = [{"role": "user", "content": observation}]
        if instructions:
            messages.insert(0, {"role": "system", "content": instructions})
        return self.encode(self._render(messages, True, tools))

    def next_turn(self, observation: str, response_ended_with_stop: bool) -> list[int]:
        """Tokens between the model's last response and its next one."""
        between = self._between
        if response_ended_with_stop:
            for stop in self._stop_texts:
                if between.startswith(stop):
                    between = between[len(stop):]
                    break
        return self.encode(between.replace(_OBS, observation))

    def encode(self, text: str) -> list[int]:
        if self._fast is not None:
            return self._fast.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def response_text(self, token_ids: list[int]) -> str:
        ids = [t for t in token_ids if t not in self.stop_token_ids]
        if self._fast is not None:
            return self._fast.decode(ids, skip_special_tokens=True)
        return self.tokenizer.decode(ids, skip_special_tokens=True)
