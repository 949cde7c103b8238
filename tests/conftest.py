import json
import os
from pathlib import Path

import pytest

from tests.support.bad_inputs import write_bad_inputs

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data_prep" / "sample_corpus"
SHARED = REPO.parent / "shared" / "corpus"

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture(scope="session", autouse=True)
def private_caches(tmp_path_factory):
    """bloomline's caches and scratch space (bloomline/owned.py) in this session's own folders, for
    the tests and every process they start, not in the user's ~/.cache."""
    root = tmp_path_factory.mktemp("caches")
    for var, name in (("BLOOMLINE_SCRATCH", "scratch"), ("BLOOMLINE_DATA_CACHE", "data")):
        os.environ.setdefault(var, str(root / name))


@pytest.fixture(scope="session", autouse=True)
def prefect_server(tmp_path_factory):
    """One Prefect server for the session, named in ``PREFECT_API_URL`` (with its auth string) for
    every command the tests start: a command finds it configured (flows/run/api_server.py, case 1)
    instead of starting a temporary server of its own, ~5 s of CPU each on 2 cores. The server is
    the one a command would start (``api_server.start_early``), keeping its runs in this session's
    folder. A test that checks the temporary server, or Prefect's database in a home of its own,
    runs its command with :func:`tests.support.prefect.own_server`."""
    from flows.run import api_server

    if os.environ.get("PREFECT_API_URL"):  # the developer's own server: used as it is
        yield
        return
    home = os.environ.get("PREFECT_HOME")
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-server"))
    try:
        api_server.start_early()
    finally:
        if home is None:
            os.environ.pop("PREFECT_HOME")
        else:
            os.environ["PREFECT_HOME"] = home
    api_server.wait_ready()
    server = dict(api_server._server)
    api_server._server.clear()  # in this process, as in a command: the server is configured, not its own
    yield
    api_server._server.update(server)
    api_server.stop()
    api_server._server.clear()


@pytest.fixture
def sample_corpus() -> Path:
    return SAMPLE


@pytest.fixture
def shared_corpus() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared/corpus not present")
    return SHARED


@pytest.fixture
def bad_inputs():
    return write_bad_inputs


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory) -> Path:
    """The sample corpus prepared with configs/data/demo.yaml, once per session, in process (no
    Prefect: the flows are tested in tests/flows). Tests read it; one that alters data copies it first."""
    from bloomline.config import load_config
    from data_prep.config import PrepareConfig
    from data_prep.pipeline import run_all

    out = tmp_path_factory.mktemp("demo-data")
    cfg = load_config(PrepareConfig, REPO / "configs/data/demo.yaml")
    cfg.recipe = str(REPO / "configs/data/demo.yaml")  # as `bloomline prepare` records its recipe
    run_all(cfg, out)
    return out


@pytest.fixture(scope="session")
def hf_bloom(tmp_path_factory) -> Path:
    """An existing Hugging Face BLOOM made here (tests/support/hf_bloom.py): ``tok/`` a byte-level
    BPE tokenizer folder, ``model/`` a tiny random BloomForCausalLM (sharded safetensors) in bloom-tiny's shape and of its
    vocabulary, once per session."""
    from bloomline.tokenizer import open_tokenizer
    from tests.support.hf_bloom import bloom_tokenizer, tiny_bloom

    root = tmp_path_factory.mktemp("hf-bloom")
    tiny_bloom(root / "model", open_tokenizer(bloom_tokenizer(root / "tok", 4000)).vocab_size, shard_size="200KB")
    for f in (root / "tok").iterdir():  # a model folder holds its tokenizer, as on the Hub
        (root / "model" / f.name).write_bytes(f.read_bytes())
    return root


@pytest.fixture(scope="session")
def hf_data(hf_bloom, tmp_path_factory) -> Path:
    """The sample corpus prepared with configs/data/demo.yaml and the HF BLOOM's tokenizer
    (``tokenizer.model`` set to its model folder), once per session."""
    from bloomline.config import load_config
    from data_prep.config import PrepareConfig
    from data_prep.pipeline import run_all

    out = tmp_path_factory.mktemp("hf-data")
    run_all(load_config(PrepareConfig, REPO / "configs/data/demo.yaml", [f"tokenizer.model={hf_bloom / 'model'}"]), out)
    return out


@pytest.fixture(scope="session")
def dup_inputs(tmp_path_factory) -> Path:
    """The sample corpus plus copies of its documents, spread over two more files: exact copies
    (other case and punctuation), near ones (a word or two changed) and copies of copies."""
    import random
    import shutil

    rng = random.Random(0)
    src = tmp_path_factory.mktemp("dup-inputs") / "inputs"
    shutil.copytree(SAMPLE, src)
    recs = [json.loads(line) for f in sorted(SAMPLE.rglob("*.jsonl")) for line in f.read_text().splitlines()]
    out: list[list[dict]] = [[], []]
    for i, r in enumerate(recs):
        ws = r["text"].split(" ")
        for k in range(rng.choice([0, 1, 1, 2, 3])):
            if rng.random() < 0.4:
                text = r["text"].upper() + "."
            else:
                for _ in range(rng.choice([1, 2])):
                    ws[rng.randrange(len(ws))] = rng.choice(ws)
                text = " ".join(ws)
            out[k % 2].append({"id": f"copy-{i}-{k}", "text": text, "lang": r["lang"]})
    for k, rows in enumerate(out):
        (src / f"copies-{k}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return src


@pytest.fixture
def shard_table():
    """A manifest's shard as a Table, read as the trainer reads it: sha256 checked against the
    manifest, then the one reader (schema, format version, rows)."""
    import pyarrow as pa

    from data_prep.storage.shards import SCHEMA, CorruptShardError, checksum_error, read_shard

    def read(data_dir: Path, shard: dict) -> "pa.Table":
        path = Path(data_dir) / shard["path"]
        error = checksum_error(path, shard["sha256"])
        if error:
            raise CorruptShardError(error)
        return pa.Table.from_batches(read_shard(path, shard["rows"]), schema=SCHEMA)

    return read


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """The loopback S3 server (tests/support/s3.py), one for the session."""
    from tests.support.s3 import S3Server

    server = S3Server(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The S3 server's credentials in this test's environment, the standard variables only (no
    fsspec configuration, no recipe value); fsspec's cached filesystems forgotten on both sides."""
    import s3fs

    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    s3fs.S3FileSystem.clear_instance_cache()
    yield s3_server
    s3fs.S3FileSystem.clear_instance_cache()
