"""Names that come from a file or a store stay inside the folder they name a file in.

A manifest's shard ``path``, an object name listed under a prefix, a Hugging Face index's
``weight_map`` file, a grown tokenizer's ``extends.file``: each is text someone else wrote (a
bucket, a received folder), joined to a folder of ours. ``Path(root) / "../../x"`` is a path
outside ``root``, and ``Path.is_relative_to`` compares text, ``..`` included, so it does not
notice. :func:`confined` is the one check of such a name, used wherever one is joined: the name
must be relative, with no empty, ``.`` or ``..`` part (what fsspec's own recursive ``get``
refuses too), and the joined path, resolved (symlinks followed), must lie under the resolved
root. A refusal is one line naming where the name came from and the name itself.
"""

from __future__ import annotations

import json
from pathlib import Path

from bloomline.errors import BloomlineError


class UnsafeName(BloomlineError):
    """A name read from a file or a store points outside the folder it must stay in."""


def checked_name(name: object, source: str) -> str:
    """``name`` (``/``-separated, from ``source``: the file or URL that names it) when it is a
    plain relative name; UnsafeName otherwise."""
    why = None
    if not isinstance(name, str) or not name:
        why = "an empty name"
    elif "\0" in name:
        why = "a NUL byte"
    elif name.startswith("/"):
        why = "an absolute path"
    elif any(part in ("", ".", "..") for part in name.split("/")):
        why = "an empty, '.' or '..' part"
    if why:
        # json.dumps: the name is someone else's text, so any line break in it stays escaped
        raise UnsafeName(
            f"{source} names {json.dumps(name, ensure_ascii=True)}, which has {why}: a name read from a "
            f"file or a store must stay inside its folder; refused, nothing written"
        )
    return name


def confined(root: str | Path, name: object, source: str) -> Path:
    """``root / name`` for a ``name`` read from ``source`` (see the module docstring): checked by
    :func:`checked_name`, and refused when the joined path resolves outside ``root`` (a symlink
    inside it pointing elsewhere)."""
    root = Path(root)
    path = root / checked_name(name, source)
    if not path.resolve().is_relative_to(root.resolve()):
        raise UnsafeName(
            f"{source} names {json.dumps(name, ensure_ascii=True)}, which resolves outside {root} "
            f"(through a symbolic link): refused, nothing written"
        )
    return path
