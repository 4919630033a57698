"""What an image tarball would tag, read before `docker load` applies it.

`docker load` applies every name an archive carries (docker save's manifest.json RepoTags, the legacy
`repositories` file, an OCI index.json's image-name annotations). A tarball from elsewhere could so retag any
image on the host (`ubuntu:22.04`, another team's `ktsft:amx`…). ktdeploy reads those names first and loads only
an archive whose every name is one it asked for (issue 35)."""

from __future__ import annotations

import tarfile
from pathlib import Path

from ktdeploy.core.errors import ImageError
from ktdeploy.core.safeio import parse_json

MAX_MEMBERS = 200_000          # docker save writes a few per layer; a tar of millions of entries is not one
MAX_INDEX_BYTES = 16 << 20     # manifest.json / repositories / index.json


def normalise(ref: str) -> str:
    """'docker.io/library/ktsft:amx' -> 'ktsft:amx' (the names docker shows for the same image)."""
    for prefix in ("docker.io/library/", "docker.io/", "index.docker.io/library/"):
        if ref.startswith(prefix):
            return ref[len(prefix):]
    return ref


def archive_tags(archive: str | Path) -> set[str]:
    """Every image name ``archive`` would apply when loaded. ImageError when it is not a readable image tar."""
    names: set[str] = set()
    try:
        with tarfile.open(archive, "r:*") as t:
            for i, member in enumerate(t):
                if i > MAX_MEMBERS:
                    raise ImageError(f"{archive}: more than {MAX_MEMBERS} entries; not an image archive",
                                     fix="Use the file `ktdeploy image save` wrote.")
                if member.name.lstrip("./") not in ("manifest.json", "repositories", "index.json") or \
                        not member.isfile():
                    continue
                if member.size > MAX_INDEX_BYTES:
                    raise ImageError(f"{archive}: {member.name} is {member.size} bytes; not an image archive's",
                                     fix="Use the file `ktdeploy image save` wrote.")
                f = t.extractfile(member)
                data = parse_json(f.read() if f is not None else b"null")
                names |= _names(member.name.lstrip("./"), data)
    except (tarfile.TarError, OSError, ValueError, EOFError) as err:
        raise ImageError(f"{archive}: not a readable image archive ({str(err)[:200]})",
                         fix="Is the file complete? Compare its size or sha256 with the source host's.") from None
    return {normalise(n) for n in names}


def _names(kind: str, data: object) -> set[str]:
    out: set[str] = set()
    if kind == "manifest.json" and isinstance(data, list):
        for entry in data:
            tags = entry.get("RepoTags") if isinstance(entry, dict) else None
            out |= {str(t) for t in tags} if isinstance(tags, list) else set()
    elif kind == "repositories" and isinstance(data, dict):
        for repo, tags in data.items():
            out |= {f"{repo}:{tag}" for tag in tags} if isinstance(tags, dict) else {str(repo)}
    elif kind == "index.json" and isinstance(data, dict):
        for m in data.get("manifests") or [] if isinstance(data.get("manifests"), list) else []:
            ann = m.get("annotations") if isinstance(m, dict) else None
            if isinstance(ann, dict) and ann.get("io.containerd.image.name"):
                out.add(str(ann["io.containerd.image.name"]))
    return out


def require_only(archive: str | Path, allowed: set[str], what: str) -> set[str]:
    """The archive's names, when every one is in ``allowed``; else ImageError naming the others (nothing loaded)."""
    tags = archive_tags(archive)
    extra = sorted(tags - {normalise(a) for a in allowed})
    if extra:
        raise ImageError(f"{archive} would also tag {', '.join(extra[:10])}" + (" …" if len(extra) > 10 else "") +
                         f", which ktdeploy did not ask for ({what}); nothing was loaded",
                         fix="Load only archives `ktdeploy image save` wrote for these images, or load this one "
                             "yourself with `docker load` if you trust every name in it.")
    return tags
