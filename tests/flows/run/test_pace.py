"""The evaluation process's CPU cap while training runs (flows/run/pace.py)."""

import time

import pytest
import torch

from flows.run.pace import Pacer, install


class Clocks:
    """A process that burns CPU as fast as wall time passes, except while it sleeps."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    def work(self, s: float) -> None:
        self.wall += s
        self.cpu += s

    def sleep(self, s: float) -> None:
        self.wall += s


def test_cpu_held_to_share_while_active_then_free():
    c, active, ended = Clocks(), [True], []
    p = Pacer(
        0.25,
        active=lambda: active[0],
        burst_s=1.0,
        check_s=0.0,
        active_every_s=0.0,
        clock=lambda: c.wall,
        cpu=lambda: c.cpu,
        sleep=c.sleep,
        on_end=lambda: ended.append(c.wall),
    )
    for _ in range(400):
        c.work(0.05)
        p.pace()
    assert abs(c.cpu - 20.0) < 1e-9
    assert c.cpu <= 0.25 * c.wall + 1.0 + 1e-9 and c.wall > 75  # 20 CPU s took ~76 wall s
    assert abs(p.slept - (c.wall - c.cpu)) < 1e-9
    active[0] = False  # training ended: no more sleeping
    wall = c.wall
    for _ in range(100):
        c.work(0.05)
        p.pace()
    assert abs(c.wall - wall - 5.0) < 1e-9
    assert ended == [pytest.approx(wall + 0.05)]  # told once, at the first pace after training ended


def test_waiting_banks_at_most_the_burst():
    c = Clocks()
    p = Pacer(
        0.1,
        active=lambda: True,
        burst_s=0.5,
        check_s=0.0,
        active_every_s=0.0,
        clock=lambda: c.wall,
        cpu=lambda: c.cpu,
        sleep=c.sleep,
    )
    c.sleep(600)  # ten minutes waiting for a checkpoint
    p.pace()
    c.work(2.0)
    p.pace()
    assert abs(p.slept - (2.0 - 0.5) / 0.1) < 1e-9


def test_a_long_debt_stops_being_paid_when_training_ends():
    """5 s of CPU at share 0.1 is a 50 s debt, slept in slices: training ending mid-way ends it."""
    c, naps = Clocks(), []

    def sleep(s):
        naps.append(s)
        c.sleep(s)

    p = Pacer(
        0.1,
        active=lambda: len(naps) < 3,
        burst_s=0.0,
        check_s=0.0,
        active_every_s=0.0,
        clock=lambda: c.wall,
        cpu=lambda: c.cpu,
        sleep=sleep,
    )
    c.work(5.0)
    p.pace()
    assert naps == [1.0, 1.0, 1.0] and p.slept == 3.0


def test_installed_on_every_forward_caps_a_real_model():
    """Real forwards of a torch model in this process: without the hook they take all the CPU."""
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh())
    x = torch.randn(64, 256)

    def burn(seconds: float) -> tuple[float, float]:
        wall, cpu = time.monotonic(), time.process_time()
        while time.monotonic() - wall < seconds:
            with torch.no_grad():
                model(x)
        return time.monotonic() - wall, time.process_time() - cpu

    free_wall, free_cpu = burn(1.0)
    assert free_cpu > 0.45 * free_wall  # more than twice the share paced below
    pacer = Pacer(0.2, active=lambda: True, burst_s=0.1)
    remove = install(pacer)
    try:
        wall, cpu = burn(2.0)
    finally:
        remove()
    assert cpu <= 0.2 * wall + 0.1 + 0.15, (cpu, wall)  # + the burst, + a check interval's slack
    assert pacer.slept > 1.0


def test_imports_are_paced(tmp_path, monkeypatch):
    """The first evaluation imports for seconds: each import waits its turn too."""
    for i in range(30):
        (tmp_path / f"paced_mod_{i}.py").write_text(
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.02:\n    pass\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    pacer = Pacer(0.2, active=lambda: True, burst_s=0.05, check_s=0.0)
    remove = install(pacer)
    try:
        wall, cpu = time.monotonic(), time.process_time()
        for i in range(30):
            __import__(f"paced_mod_{i}")
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    finally:
        remove()
    assert cpu >= 0.6 and cpu <= 0.2 * wall + 0.05 + 0.03, (cpu, wall)
