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
