"""Batched greedy decoding through the key-value cache (eval/generate.py ``generate``) gives each
prompt the tokens the cache-free reference (``greedy``) gives it alone."""

import torch

from eval.generate import BATCH, generate, greedy
from eval.model import LocalModel
from training.config import ModelConfig
from training.model.bloom import Bloom

# Weights this large make a random model's next token depend on its whole context (at the usual
# 0.02 it repeats the prompt's last token whatever came before), so a wrong key, mask or ALiBi
# distance changes the tokens.
CFG = ModelConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=4, seq_len=64, init_std=0.5)
NEW = 10


def test_generate_with_the_cache_equals_greedy_alone_for_prompts_of_every_length():
    """More prompts than one batch, of lengths 1 to 14 (left-padded together); one ends at </s>,
    one at ``stop``, the others run to ``new_tokens``."""
    bloom = Bloom(CFG, seed=3).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, CFG.vocab_size, (1 + k % 14,), generator=g).tolist() for k in range(BATCH + 3)]
    free = [greedy(bloom, p, NEW, eos_id=-1) for p in prompts]
    # </s>: a token that one continuation alone holds, after its start
    (eos, ends), *_ = [
        (t, k)
        for t in range(CFG.vocab_size)
        for k, f in enumerate(free)
        if t in f[2:] and t not in f[:2] and sum(t in f_ for f_ in free) == 1
    ]
    stops = next(k for k, f in enumerate(free) if k != ends and [f_[:3] for f_ in free].count(f[:3]) == 1)

    def stop(ids: list[int]) -> bool:  # prompts[stops] alone: its continuation ends at its 3rd token
        return ids == free[stops][:3]

    want = [greedy(bloom, p, NEW, eos, stop) for p in prompts]
    got = generate(LocalModel(bloom, torch.device("cpu")), prompts, NEW, eos, stop)
    assert got == want
    assert want[ends] == free[ends][: free[ends].index(eos)] and want[stops] == free[stops][:3]
    assert sum(len(w) == NEW for w in want) == len(prompts) - 2
    assert len({tuple(w) for w in want}) > BATCH  # the prompts' continuations differ: context matters
