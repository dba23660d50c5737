"""The check both engines' top_logprobs tests make against a transformers forward pass."""

import torch


def assert_top_logprobs_match_forward(model, prompt: list[int], out, k: int, temperature: float, atol: float,
                                      sampled_atol: float) -> None:
    """Each generated token's k alternatives are the k likeliest of log_softmax(logits / temperature)
    at its position (values and ids), and the sampled token's log-prob is among them where it is one."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1:-1].float() / temperature
    ref = torch.log_softmax(logits, -1)
    assert len(out.top_logprobs) == len(out.token_ids)
    for i, (token, logprob, alternatives) in enumerate(zip(out.token_ids, out.logprobs, out.top_logprobs)):
        ids = [t for t, _ in alternatives]
        values = torch.tensor([v for _, v in alternatives])
        assert len(set(ids)) == k
        assert torch.allclose(values, ref[i].topk(k).values, atol=atol)  # the k likeliest values
        assert torch.allclose(values, ref[i, ids], atol=atol)  # and these tokens have them
        assert all(abs(v - logprob) < sampled_atol for t, v in alternatives if t == token)
