"""WeightSync implementations (the contract: roll_agent/protocols.py, `WeightSync`): each moves
the trainer's weights into the engines it is given, while the LLMProxy that owns it is
suspended, and returns a `SyncReport` (bytes moved, seconds taken).

    inprocess.InProcessSync   tensors copied between models in one process (the local runtime)
    inprocess.VersionOnlySync no weights, only the version (scripted engines in tests, benchmarks)
    actors.BroadcastSync      trainer actor -> engine actors: torch.distributed in flat buckets (buckets.py)
    actors.ObjectStoreSync    trainer actor -> engine actors: one object in Ray's store (LoRA adapters)
"""
