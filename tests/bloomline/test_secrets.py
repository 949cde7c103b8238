"""Secrets are masked in what people read: URL passwords, token query parameters, secret-named keys and variables."""

import logging

from bloomline.secrets import MASK, MaskingFilter, mask_text, mask_tree


def test_url_passwords_and_query_tokens_are_masked():
    assert mask_text("tcp://alice:hunter22@10.0.0.1:8786", env={}) == f"tcp://alice:{MASK}@10.0.0.1:8786"
    assert mask_text("https://h/x.jsonl?token=abc123&part=2", env={}) == f"https://h/x.jsonl?token={MASK}&part=2"
    assert mask_text("s3://b/k?X-Amz-Signature=deadbeef", env={}) == f"s3://b/k?X-Amz-Signature={MASK}"
    assert mask_text("plain words, tcp://host:8786, a:b@c", env={}) == "plain words, tcp://host:8786, a:b@c"


def test_values_of_secret_environment_variables_are_masked_wherever_they_appear():
    env = {"HF_TOKEN": "hf_abcdef123456", "WANDB_API_KEY": "0123456789", "NCCL_DEBUG": "INFO", "MY_PASSWORD": "1"}
    assert (
        mask_text("cmd --token hf_abcdef123456 key=0123456789 level INFO 1", env=env)
        == f"cmd --token {MASK} key={MASK} level INFO 1"
    )  # too short a value ("1") is left: it would mask words


def test_trees_mask_secret_named_keys_and_strings():
    tree = {
        "dask": {"address": "tls://u:pw123@h:1"},
        "api_key": "k-123",
        "sources": [{"path": "/data/x.jsonl"}],
        "n": 3,
    }
    assert mask_tree(tree, env={}) == {
        "dask": {"address": f"tls://u:{MASK}@h:1"},
        "api_key": MASK,
        "sources": [{"path": "/data/x.jsonl"}],
        "n": 3,
    }


def test_log_records_are_masked_before_handlers_see_them(caplog):
    logger = logging.getLogger("bloomline.test.secrets")
    logger.addFilter(MaskingFilter())
    with caplog.at_level(logging.INFO, logger="bloomline.test.secrets"):
        logger.info("connecting to %s", "tcp://bob:s3cr3tpw@host:1")
    assert "s3cr3tpw" not in caplog.text and f"bob:{MASK}@" in caplog.text
