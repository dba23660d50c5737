"""The tiny model's chat template: bare ChatML for plain chats, Hermes-style tools, parseable tool calls."""

from roll_agent.tiny_model import build_tokenizer

BARE_CHATML = "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in
                      (("system", "S"), ("user", "U"), ("assistant", "A"), ("user", "O")))
PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
TOOL = {"type": "function", "function": {"name": "calculator", "description": "d",
                                         "parameters": {"type": "object", "properties": {}}}}


def test_plain_conversations_render_as_bare_chatml(tokenizer):
    messages = [{"role": r, "content": t} for r, t in (("system", "S"), ("user", "U"), ("assistant", "A"),
                                                        ("user", "O"))]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == BARE_CHATML
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        BARE_CHATML + "<|im_start|>assistant\n"


def test_tools_tool_calls_and_tool_results_render(tokenizer):
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1+2"}}}
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": "calculator", "content": "3"}]
    text = tokenizer.apply_chat_template(messages, tools=[TOOL], tokenize=False)
    assert text.startswith("<|im_start|>system\nS\n\nTools:\n{\"type\": \"function\"")
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n' \
           "</tool_call><|im_end|>\n" in text
    assert text.endswith("<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n")


def test_tool_calls_parse_back(tokenizer):
    parsed = tokenizer.parse_response(
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call><|im_end|>',
        prefix=PROMPT)
    assert parsed["tool_calls"] == [{"type": "function",
                                     "function": {"name": "calculator", "arguments": {"expression": "1+2"}}}]
    assert tokenizer.parse_response("<answer>3</answer><|im_end|>", prefix=PROMPT)["content"] == "<answer>3</answer>"


def test_saved_tokenizer_keeps_template_and_parser(tmp_path):
    from transformers import AutoTokenizer

    build_tokenizer(["hello world"] * 5, vocab_size=280).save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.parse_response("<answer>3</answer><|im_end|>", prefix=PROMPT)["content"] == "<answer>3</answer>"


def test_a_qwen3_style_template_plays_token_in_token_out():
    """Qwen3's template renders an assistant turn that comes *last* with an empty <think> block, and
    one followed by a user turn without it: the formatter reads the text between turns from the
    latter (what an episode's next prompt is), so it accepts the template. A two-turn episode's
    tokens are the template's rendering of the conversation, but for the thinking the model
    sampled, which the episode keeps (the model saw it) and the template drops from old turns."""
    from pathlib import Path

    from roll_agent.rollout.chat import ChatFormatter
    from roll_agent.tiny_model import build_tokenizer

    tokenizer = build_tokenizer(["You play a game. left right up down", "<think> </think>"] * 10, vocab_size=300)
    tokenizer.add_tokens(["<think>", "</think>", "<tool_call>", "</tool_call>"])
    tokenizer.chat_template = (Path(__file__).parents[1] / "agents" / "templates" / "qwen3.jinja").read_text()
    formatter = ChatFormatter(tokenizer)
    answer = formatter.encode("<think>\nok\n</think>\n\nleft") + [formatter.end_of_turn_id]
    ids = formatter.first_prompt("You play.", "start") + answer + formatter.next_turn("moved", True)
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": "You play."}, {"role": "user", "content": "start"},
         {"role": "assistant", "content": "<think>\nok\n</think>\n\nleft"}, {"role": "user", "content": "moved"}],
        tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(ids, skip_special_tokens=False).replace("<think>\nok\n</think>\n\n", "") == rendered
