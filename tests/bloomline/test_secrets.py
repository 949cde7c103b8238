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


def test_masking_is_linear_on_hostile_text():
    """One long id of ``a.a.a…`` took the URL pattern quadratic time (40k characters 6.8 s): a
    megabyte of each shape that made a search backtrack is masked in well under a second each."""
    import time

    from tests.support.fuzz_inputs import hostile_runs

    for name, text in hostile_runs(1 << 20).items():
        t0 = time.perf_counter()
        mask_text(text, env={})
        assert time.perf_counter() - t0 < 1.0, name


def test_secret_query_parameters_are_masked():
    for name in ("client_secret", "access_key", "apikey", "X-Goog-Signature", "X-Goog-Credential", "api_key"):
        url = f"https://h/x?part=1&{name}=s3cr3tvalue&b=2"
        assert mask_text(url, env={}) == f"https://h/x?part=1&{name}={MASK}&b=2", name
    assert mask_text("https://h/x?sort=name&monkey=3", env={}) == "https://h/x?sort=name&monkey=3"


def test_secret_environment_names_are_masked_and_the_working_directory_is_not():
    env = {
        "DB_PASS": "pass-value-1",
        "MYSQL_PWD": "pwd-value-22",
        "SSH_KEY_PASSPHRASE": "phrase-value-3",
        "GPG_PRIVATE_KEY": "pk-value-4444",
        "PWD": "/home/alice/work",
        "OLDPWD": "/home/alice",
    }
    text = "pass-value-1 pwd-value-22 phrase-value-3 pk-value-4444 in /home/alice/work from /home/alice"
    assert mask_text(text, env=env) == f"{MASK} {MASK} {MASK} {MASK} in /home/alice/work from /home/alice"
    assert mask_tree({"smtp_pass": "x", "db_pwd": "y", "passphrase": "z", "private_key": "w"}, env={}) == {
        "smtp_pass": MASK,
        "db_pwd": MASK,
        "passphrase": MASK,
        "private_key": MASK,
    }


def test_url_passwords_holding_at_signs_and_slashes_are_masked_to_the_last_at():
    assert mask_text("s3://user:p@ss/w0rd@host/x", env={}) == f"s3://user:{MASK}@host/x"
    assert mask_text("copy s3://u:a/b@c@h/k to tcp://v:q@r@h2:1 now", env={}) == (
        f"copy s3://u:{MASK}@h/k to tcp://v:{MASK}@h2:1 now"
    )
    assert (
        mask_text('{"src": "s3://u:p@w@h/x", "who": "a@b"}', env={}) == f'{{"src": "s3://u:{MASK}@h/x", "who": "a@b"}}'
    )
    from bloomline.secrets import secret_parts

    assert secret_parts({"a": "s3://user:p@ss/w0rd@host/x"}) == {"p@ss/w0rd"}


def test_a_token_as_a_urls_whole_user_part_is_masked_and_a_user_name_is_not():
    tok = "ghp_" + "A1b2C3d4" * 5
    assert mask_text(f"git clone https://{tok}@github.com/o/r.git", env={}) == (
        f"git clone https://{MASK}@github.com/o/r.git"
    )
    assert mask_text("ssh://git@host/x https://user@host/y s3://bucket/key@v2", env={}) == (
        "ssh://git@host/x https://user@host/y s3://bucket/key@v2"
    )
    from bloomline.secrets import secret_parts

    assert secret_parts({"remote": f"https://{tok}@github.com/o/r.git"}) == {tok}


def test_tracebacks_are_masked_whatever_formats_them():
    """A record's exception is formatted once, masked, as its ``exc_text``, and its ``exc_info``
    cleared: Prefect's JSON formatter formats ``exc_info`` itself."""
    from prefect.logging.formatters import JsonFormatter

    logger = logging.getLogger("bloomline.test.tracebacks")
    logger.addFilter(MaskingFilter())
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    logger.addHandler(handler)
    try:
        try:
            raise ValueError("cannot reach tcp://bob:tb-s3cr3t@host:1")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    (rec,) = seen
    for out in (logging.Formatter().format(rec), JsonFormatter("default", None, "%").format(rec)):
        assert "tb-s3cr3t" not in out and f"bob:{MASK}@host" in out and "ValueError" in out


def test_every_logger_is_masked_dask_children_included():
    """A filter on ``distributed`` never saw ``distributed.worker``'s records (a logger's filters
    see its own records only): every record is masked as it is made."""
    import io

    from bloomline.secrets import install_log_masking

    install_log_masking()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)  # as Dask's, on the parent logger
    parent = logging.getLogger("distributed")
    parent.addHandler(handler)
    try:
        for child in ("distributed.worker", "distributed.nanny", "distributed.scheduler", "distributed.core"):
            logging.getLogger(child).error("connect tcp://w:child-s3cr3t@h:1 from %s", child)
    finally:
        parent.removeHandler(handler)
    assert "child-s3cr3t" not in stream.getvalue() and stream.getvalue().count(f"w:{MASK}@h") == 4


def test_failed_states_carry_masked_messages():
    """What Prefect records of a failed flow or task run (its state's message, made by
    ``exception_to_failed_state``) from an exception that left a :func:`masks_exceptions` function."""
    import asyncio

    import pytest
    from prefect.states import exception_to_failed_state

    from bloomline.errors import ConfigError, DataError
    from bloomline.secrets import masks_exceptions

    url = "tcp://u:state-s3cr3t@h:1"
    for exc, kind in (
        (DataError(f"cannot read {url}"), DataError),
        (ConfigError("dask.address", f"bad {url}"), ConfigError),
        (FileNotFoundError(2, "No such file", f"/d/{url}"), FileNotFoundError),
    ):

        def fails():
            raise exc

        with pytest.raises(kind) as caught:  # the same exception: callers catching it by type still do
            masks_exceptions(fails)()
        state = asyncio.run(exception_to_failed_state(caught.value))
        assert "state-s3cr3t" not in state.message and f"u:{MASK}@h" in state.message, state.message


def test_headers_secret_pairs_and_json_members_are_masked_unseen_in_any_config():
    cases = {
        "GET /x Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig": f"GET /x Authorization: Bearer {MASK}",
        "headers={'Authorization': 'Basic dXNlcjpodW50ZXIy'}": f"headers={{'Authorization': 'Basic {MASK}'}}",
        "authorization: AWS4-HMAC-SHA256 Credential=AKIA/x, Signature=abcdef": f"authorization: AWS4-HMAC-SHA256 {MASK}",
        "retrying with Bearer ya29.a0AfH6SMBx": f"retrying with Bearer {MASK}",
        "login failed: password=hunter22 user=bob": f"login failed: password={MASK} user=bob",
        'passwd = "xyzzy-42"; secret=s3cr3t&token=t0k3n': f'passwd = "{MASK}"; secret={MASK}&token={MASK}',
        'body {"aws_secret_access_key": "wJalrXUtnFEMI/K7MDENG", "region": "us-east-1"}': (
            f'body {{"aws_secret_access_key": "{MASK}", "region": "us-east-1"}}'
        ),
    }
    for text, masked in cases.items():
        assert mask_text(text, env={}) == masked, text
    # words that only look alike are left as they are
    plain = 'basic filters, the bearer of news, tokens=128 max_tokens=5, author: Bob, {"region": "eu"}'
    assert mask_text(plain, env={}) == plain
