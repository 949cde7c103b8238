"""eval/model.py: where an evaluation runs, and how its rows name it."""

import pytest
import torch

from bloomline.errors import ConfigError
from eval.model import eval_layout, resolve_device


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_refused_in_one_line_and_auto_is_the_cpu():
    with pytest.raises(ConfigError) as e:
        resolve_device("cuda")
    msg = str(e.value)  # one line naming the key and the way out
    assert (
        "\n" not in msg and msg.startswith("config key 'device': cuda, but torch sees no GPU") and "device=cpu" in msg
    )
    assert resolve_device("auto") == resolve_device("cpu") == torch.device("cpu")
    assert eval_layout(1, 1, resolve_device("auto")) == "tp=1 pp=1 device=cpu"
    assert eval_layout(2, 4, "cuda:1") == "tp=2 pp=4 device=cuda"  # the device's kind, not its index
