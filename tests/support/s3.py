"""An S3-compatible server on loopback for the object-store tests: moto in server mode, as s3fs's
own test suite uses it, started by the tests themselves.

It checks credentials: the first requests, unauthenticated, make an IAM user allowed everything on
S3 and its access key (moto's ``INITIAL_NO_AUTH_ACTION_COUNT``); every request after must be
signed with that key, so a wrong key is refused as AWS refuses it. :attr:`S3Server.env` is the
standard environment a user sets (endpoint, key id, secret, region) and nothing else.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

_SETUP_REQUESTS = 4  # IAM: create user, put its policy, create its key; S3: create the bucket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """``moto_server`` on 127.0.0.1, with one bucket and one user's key (:attr:`env`)."""

    def __init__(self, log: Path, bucket: str = "corpora"):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.bucket = bucket
        moto = Path(sys.executable).with_name("moto_server")
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_SETUP_REQUESTS)}
        # started by a shell that exits at once: the server is no child of the tests' process,
        # whose tests count their own children (the ranks they start must all be gone)
        cmd = f"{shlex.quote(str(moto))} -H 127.0.0.1 -p {self.port} > {shlex.quote(str(log))} 2>&1 & echo $!"
        self.pid = int(subprocess.run(["sh", "-c", cmd], env=env, capture_output=True, text=True, check=True).stdout)
        self._wait()
        self.env = self._setup()

    def _wait(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2)
                return
            except OSError:
                if not psutil.pid_exists(self.pid):
                    raise RuntimeError("moto_server exited") from None
                time.sleep(0.2)
        raise RuntimeError("moto_server did not start")

    def _setup(self) -> dict[str, str]:
        import boto3

        anon = dict(
            endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
        )
        iam = boto3.client("iam", **anon)
        iam.create_user(UserName="bloomline")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        iam.put_user_policy(UserName="bloomline", PolicyName="s3", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="bloomline")["AccessKey"]
        boto3.client("s3", **anon).create_bucket(Bucket=self.bucket)
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    @property
    def secret(self) -> str:
        return self.env["AWS_SECRET_ACCESS_KEY"]

    def fs(self) -> Any:
        """An s3fs filesystem with this server's key (a fresh instance: not fsspec's cached one)."""
        import s3fs

        e = self.env
        return s3fs.S3FileSystem(
            key=e["AWS_ACCESS_KEY_ID"],
            secret=e["AWS_SECRET_ACCESS_KEY"],
            endpoint_url=self.endpoint,
            client_kwargs={"region_name": "us-east-1"},
            skip_instance_cache=True,
        )

    def stop(self) -> None:
        try:
            p = psutil.Process(self.pid)
            p.terminate()
            p.wait(10)
        except psutil.NoSuchProcess:
            pass
        except psutil.TimeoutExpired:
            p.kill()
