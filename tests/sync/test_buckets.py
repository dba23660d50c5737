"""Bucketed torch.distributed broadcast (gloo) moves a real model's weights between processes."""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import pytest

from roll_agent.sync.buckets import broadcast_receive_into, broadcast_send, bucket_device, layout, spec_of


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, model_dir: str, results) -> None:
    from transformers import AutoModelForCausalLM

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        named = list(model.named_parameters())
        device = bucket_device()  # the NCCL path differs only here: cuda buckets
        assert device == torch.device("cpu")
        if rank == 0:
            torch.manual_seed(1)
            with torch.no_grad():
                for _, p in named:
                    p.add_(torch.randn_like(p))
            report = broadcast_send(named, bucket_mb=0.05, device=device)
        else:
            report = broadcast_receive_into(named, bucket_mb=0.05, device=device)
        results[rank] = (report["bytes"], float(sum(p.double().sum() for _, p in named)))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_bucketed_broadcast_between_processes(tiny_model_dir):
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(_free_port(), tiny_model_dir, results), nprocs=2, join=True)
    (sent, checksum_sender), (received, checksum_receiver) = results[0], results[1]
    assert sent == received > 0
    assert checksum_sender == checksum_receiver


def test_layout_splits_by_size_and_dtype():
    named = [("a", torch.zeros(100)), ("b", torch.zeros(100)), ("c", torch.zeros(10, dtype=torch.bfloat16)),
             ("d", torch.zeros(300))]
    buckets = layout(spec_of(named), bucket_mb=800 / 2**20)  # 800 bytes: two fp32 x100 per bucket
    assert buckets == [[0, 1], [2], [3]]
